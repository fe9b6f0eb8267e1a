"""A refusal reaches only the leg whose row it refused (``node.ring.loses_row``): a session id
opened again on a shard gets a new leg incarnation, and a late refusal of the old leg's row must
not fail the new leg, whatever the steps. An older receiver echoes no incarnation (0): then the
step alone decides, as before incarnations."""

from __future__ import annotations

import pytest

from meshnet.core.ids import UNKNOWN_INCARNATION, LegIncarnation, new_leg_incarnation
from meshnet.node.ring import RingLeg, loses_row
from meshnet.wire.batch_frames import LostRow

OWN, OTHER = LegIncarnation(0x1234), LegIncarnation(0x9876)


@pytest.mark.parametrize(
    ("lost", "batched_step", "answered_through", "expected"),
    [
        (LostRow(6, OWN), 6, -1, True),  # a middle's own row, refused
        (LostRow(6, OTHER), 6, -1, False),  # the old opening's row, refused late
        (LostRow(2, OTHER), 6, -1, False),  # steps need not line up for a middle to be hit
        (LostRow(6, UNKNOWN_INCARNATION), 6, -1, True),  # an older receiver: as before
        (LostRow(6, OWN), 6, 6, False),  # a head whose tail answered step 6: the row arrived
        (LostRow(6, UNKNOWN_INCARNATION), 6, 6, False),
        (LostRow(None, OWN), 7, 6, True),  # a broken stream with the last row unanswered
        (LostRow(None, OWN), 6, 6, False),  # ... or answered
        (LostRow(None, OTHER), 7, 6, False),
    ],
)
def test_a_lost_row_ends_only_the_leg_that_sent_it(
    lost: LostRow, batched_step: int, answered_through: int, expected: bool
) -> None:
    assert loses_row(lost, OWN, batched_step, answered_through) is expected


def test_each_opening_draws_its_own_nonzero_incarnation() -> None:
    drawn = {new_leg_incarnation() for _ in range(1_000)}
    assert len(drawn) == 1_000 and UNKNOWN_INCARNATION not in drawn
    assert RingLeg().incarnation != RingLeg().incarnation
    assert 0 < RingLeg().incarnation < 1 << 64  # fits the wire's uint64
