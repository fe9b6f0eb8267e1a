"""Who may send a session's ring batch rows (``node.ring_rows.row_refusal``)."""

from __future__ import annotations

from meshnet.node.ring_rows import row_refusal


def test_a_row_goes_to_a_held_session_from_the_peer_that_opened_it() -> None:
    assert row_refusal(True, "node-a", "node-a", epoch=3, session_epoch=3) is None


def test_unsecured_workers_check_nobody() -> None:
    assert row_refusal(True, None, None, epoch=0, session_epoch=0) is None


def test_a_row_for_a_session_not_held_here_is_refused() -> None:
    reason = row_refusal(False, "node-a", None, epoch=3, session_epoch=None)
    assert reason is not None and "no such session" in reason


def test_a_row_from_another_peer_is_refused_without_reaching_the_session() -> None:
    reason = row_refusal(True, "node-b", "node-a", epoch=3, session_epoch=3)
    assert reason is not None and "another peer" in reason
    assert row_refusal(True, None, "node-a", epoch=3, session_epoch=3) is not None


def test_a_late_row_of_an_earlier_opening_is_refused_without_reaching_the_reopened_session() -> None:
    # The session id was opened again here by a newer route (epoch 4); a row of its epoch-3
    # opening still on its way would end the new session (RouteStale) if it reached it.
    reason = row_refusal(True, "node-a", "node-a", epoch=3, session_epoch=4)
    assert reason is not None and "epoch 3" in reason and "epoch 4" in reason
    assert row_refusal(True, None, None, epoch=5, session_epoch=4) is not None
