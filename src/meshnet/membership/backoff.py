"""How long a member waits before asking the tracker again, so thousands of nodes never ask in step.

Three waits, each a pure function of a count or a hint and one draw from ``[0, 1)`` (the caller
passes ``random.Random(seed).random`` in tests, ``random.random`` in a process):

- ``BusyBackoff``: the tracker shed the call (``TrackerBusy``, RESOURCE_EXHAUSTED with a retry
  hint). Wait the hint spread evenly over ``[hint/2, hint*3/2]``: on average the tracker's own
  pace, and nodes shed in the same instant come back over a whole hint instead of together
  (a hint of 0 or above the cap is first brought within bounds, so the spread holds there too).
- ``RejoinDelay``: the tracker forgot the node (it restarted, or a replica that never knew it
  answered). Register after a uniform fraction of one heartbeat interval: after a restart every
  node learns this within one interval of the others, and a mass join spread over one more
  interval is what the tracker can absorb (3,000 nodes at 2 s: 1,500 registrations a second
  instead of 3,000 in the same millisecond), while no node is out of routes much longer.
- ``RefusalBackoff``: the tracker refused the node (quarantined): doubling waits, capped.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from meshnet.core.errors import InvalidArgument

Draw = Callable[[], float]
"""A uniform draw from ``[0, 1)``: ``random.random`` or a seeded ``random.Random(...).random``."""


@dataclass(frozen=True)
class BusyBackoff:
    """The wait after the tracker shed a call with a retry hint: uniform in ``[hint*(1-spread),
    hint*(1+spread)]``. The hint is first held within ``[min_s, max_s/(1+spread)]``: a hint of
    0 would let every node ask again at once (a tight loop), and a hint above the cap would
    send half the nodes back at exactly ``max_s``, in step again. So the wait never exceeds
    ``max_s`` (a hint is the tracker's, and a wrong one may slow a node, never park it) and
    stays spread at both edges."""

    spread: float = 0.5
    max_s: float = 60.0
    min_s: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 <= self.spread <= 1.0 or not 0 < self.min_s <= self.max_s / (1.0 + self.spread):
            raise InvalidArgument(
                f"busy backoff: spread must be in [0, 1] and 0 < min_s <= max_s / (1 + spread), got {self}"
            )

    def wait_s(self, hint_s: float, draw: Draw = random.random) -> float:
        hint = min(max(hint_s, self.min_s), self.max_s / (1.0 + self.spread))
        return hint * (1.0 - self.spread + 2.0 * self.spread * draw())


@dataclass(frozen=True)
class RejoinDelay:
    """The wait before registering again with a tracker that forgot the node: a uniform
    fraction, at most ``fraction``, of one heartbeat interval."""

    fraction: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise InvalidArgument(f"rejoin delay: fraction must be in [0, 1], got {self.fraction}")

    def wait_s(self, interval_s: float, draw: Draw = random.random) -> float:
        return max(interval_s, 0.0) * self.fraction * draw()


@dataclass(frozen=True)
class RefusalBackoff:
    """How a refused node (quarantined, say) asks again: never a silent exit, never a flood.

    In heartbeat intervals (the tracker's pace): the n-th refusal in a row waits ``2**(n-1)``
    intervals, at most ``max_beats``, each wait drawn between half and all of it (jitter: nodes
    refused together do not come back in step). So ``swarm quarantine clear`` lets the node back
    within ``max_beats`` heartbeats, and a refused node costs the tracker a call every few beats.
    """

    max_beats: float = 4.0

    def wait_s(self, refusals: int, interval_s: float, draw: Draw = random.random) -> float:
        full = interval_s * min(2.0 ** max(refusals - 1, 0), self.max_beats)
        return full * (0.5 + 0.5 * draw())
