"""Who may send a session's ring batch rows (``node.ring_rows.row_refusal``)."""

from __future__ import annotations

from meshnet.node.ring_rows import row_refusal


def test_a_row_goes_to_a_held_session_from_the_peer_that_opened_it() -> None:
    assert row_refusal(True, "node-a", "node-a") is None


def test_unsecured_workers_check_nobody() -> None:
    assert row_refusal(True, None, None) is None


def test_a_row_for_a_session_not_held_here_is_refused() -> None:
    reason = row_refusal(False, "node-a", None)
    assert reason is not None and "no such session" in reason


def test_a_row_from_another_peer_is_refused_without_reaching_the_session() -> None:
    reason = row_refusal(True, "node-b", "node-a")
    assert reason is not None and "another peer" in reason
    assert row_refusal(True, None, "node-a") is not None
