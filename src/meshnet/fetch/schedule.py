"""Which piece each holder fetches next: a pure schedule over pieces, holders and failures.

Every pending piece goes to a holder that holds its artifact, is neither dead nor bad, and has
no request for it in flight; a holder that fails (gone) or sends a piece that does not verify
(bad) gets nothing more, and its piece returns to the pending set for another holder. Pieces are
handed out in order, so with several holders each streams its share of consecutive pieces.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from meshnet.artifact.assemble import PieceRef


@dataclass
class PieceSchedule:
    pending: list[PieceRef]
    holders_of: Mapping[str, frozenset[str]]
    """Artifact digest -> addresses of its live holders."""
    in_flight: dict[PieceRef, str] = field(default_factory=dict)
    dead: set[str] = field(default_factory=set)
    bad: set[str] = field(default_factory=set)
    done: int = 0

    @classmethod
    def of(cls, pieces: Iterable[PieceRef], holders_of: Mapping[str, frozenset[str]]) -> PieceSchedule:
        return cls(list(pieces), holders_of)

    def usable(self, holder: str) -> bool:
        return holder not in self.dead and holder not in self.bad

    def next_for(self, holder: str) -> PieceRef | None:
        if not self.usable(holder):
            return None
        for index, piece in enumerate(self.pending):
            if holder in self.holders_of.get(piece.artifact, frozenset()):
                del self.pending[index]
                self.in_flight[piece] = holder
                return piece
        return None

    def finished(self, piece: PieceRef) -> None:
        self.in_flight.pop(piece, None)
        self.done += 1

    def failed(self, piece: PieceRef, holder: str, *, bad: bool) -> None:
        """``holder`` could not deliver ``piece`` (gone) or delivered wrong bytes (bad)."""
        self.in_flight.pop(piece, None)
        (self.bad if bad else self.dead).add(holder)
        self.pending.insert(0, piece)

    def stranded(self) -> list[PieceRef]:
        """Pending pieces that no usable holder holds: the fetch cannot complete."""
        return [p for p in self.pending if not any(self.usable(h) for h in self.holders_of.get(p.artifact, ()))]

    def complete(self) -> bool:
        return not self.pending and not self.in_flight
