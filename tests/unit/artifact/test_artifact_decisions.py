"""The artifact plane's pure decisions: who holds what, which piece goes to which holder, and
which publisher keys are trusted."""

from __future__ import annotations

import pytest
from manual_clock import ManualClock

from meshnet.artifact.assemble import PieceRef
from meshnet.artifact.directory import Advertisement, HeldManifest, HolderDirectory
from meshnet.artifact.trust import judge_publisher
from meshnet.core.errors import InvalidArgument
from meshnet.fetch.schedule import PieceSchedule

A, B, M = "a" * 64, "b" * 64, "c" * 64


def test_the_directory_answers_who_holds_what_and_forgets_the_silent() -> None:
    clock = ManualClock()
    directory = HolderDirectory(clock, ttl_s=3.0)
    directory.advertise(Advertisement("seed", "h1:1", frozenset({A, B}), (HeldManifest("m", M),)))
    clock.now = 2.0
    directory.advertise(Advertisement("worker", "h2:1", frozenset({B})))
    found = directory.find("m", (A, B))
    assert found.manifests == (M,)
    assert [(h.holder_id, h.artifacts) for h in found.holders] == [("seed", (A, B, M)), ("worker", (B,))]
    assert directory.find("other", (B,)).manifests == ()
    clock.now = 4.0  # the seeder is silent for 4 s > ttl
    assert [h.holder_id for h in directory.find("m", (A, B)).holders] == ["worker"]
    directory.advertise(Advertisement("worker", "h2:1", frozenset()))  # replaces, not adds
    assert directory.find("", (B,)).holders == ()


def test_advertisements_are_validated() -> None:
    with pytest.raises(InvalidArgument, match="hex"):
        Advertisement("x", "h:1", frozenset({"not-a-digest"}))
    with pytest.raises(InvalidArgument, match="holder id"):
        Advertisement("", "h:1", frozenset())


def pieces(artifact: str, count: int) -> list[PieceRef]:
    return [PieceRef(artifact, i, i * 10, 10, "0" * 64) for i in range(count)]


def test_the_schedule_shares_pieces_and_moves_failed_ones() -> None:
    schedule = PieceSchedule.of(pieces(A, 3) + pieces(B, 1), {A: frozenset({"h1", "h2"}), B: frozenset({"h2"})})
    first, second = schedule.next_for("h1"), schedule.next_for("h2")
    assert (first.index, second.index) == (0, 1)  # type: ignore[union-attr]
    schedule.failed(first, "h1", bad=True)  # type: ignore[arg-type]
    assert schedule.next_for("h1") is None and schedule.bad == {"h1"}
    assert schedule.next_for("h2") == first  # the refused piece goes first, elsewhere
    for piece in (first, second):
        schedule.finished(piece)  # type: ignore[arg-type]
    rest = [schedule.next_for("h2"), schedule.next_for("h2")]
    assert [(p.artifact, p.index) for p in rest] == [(A, 2), (B, 0)]  # type: ignore[union-attr]
    for piece in rest:
        schedule.finished(piece)  # type: ignore[arg-type]
    assert schedule.complete() and schedule.done == 4


def test_a_piece_whose_holders_all_failed_is_stranded() -> None:
    schedule = PieceSchedule.of(pieces(A, 2), {A: frozenset({"h1"})})
    piece = schedule.next_for("h1")
    schedule.failed(piece, "h1", bad=False)  # type: ignore[arg-type]
    assert schedule.dead == {"h1"} and len(schedule.stranded()) == 2 and not schedule.complete()


@pytest.mark.parametrize(
    ("pinned", "recorded", "accepted", "record"),
    [
        (None, None, True, True),  # first use: trust and remember
        (None, "fp-a", True, False),
        (None, "fp-b", False, False),  # another key than the one trusted on first use
        ("fp-a", None, True, False),  # pinned: never recorded
        ("fp-b", "fp-a", False, False),  # the pin wins over what was recorded
    ],
)
def test_publisher_trust(pinned: str | None, recorded: str | None, accepted: bool, record: bool) -> None:
    verdict = judge_publisher("m", "fp-a", pinned, recorded)
    assert (verdict.accepted, verdict.record) == (accepted, record)
