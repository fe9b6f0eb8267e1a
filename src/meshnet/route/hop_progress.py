"""When each hop last answered a step of any session this driver runs: a queued step is not a hung one.

A step's budget (``core.step_budget``) allows for one other session's engine call ahead of it on
each hop. A shard serving many sessions can hold more than that ahead of a new one: it runs one
prefill chunk a tick, oldest first, between decode waves, so the 16th of 16 sessions that arrive
together waits for 15 prefill chunks on the head before its first. Measured on a 3B-shaped model
on a slow 2-core VM (contract v5's fifth run, ``bench/results/v5/run5``): 3 of 16 requests failed
as ``worker_lost`` after a 26.5 s budget while both shards were busy with the other 13.

So a step past its budget is given another window while every hop of its route has answered
another step (of any session through that hop) since this one was sent and within the last
window: those hops' engines are running, and the step is queued behind them. A hung shard
answers nothing, so every step through it still fails within one budget after it stopped (plus
at most one window for the steps sent just before). The windows are capped by the sessions a hop
admits (``NodeCapability.max_sessions``): one other session's call ahead per window at least.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

MAX_HOPS_REMEMBERED = 4096
"""Hop addresses kept (the least recently answering dropped first): a gateway in a large swarm
meets many nodes, and only hops answering within a budget window matter."""


class HopProgress:
    """The last time (``clock``) each hop address answered a step this driver awaited."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, capacity: int = MAX_HOPS_REMEMBERED) -> None:
        self._clock = clock
        self._capacity = capacity
        self._answered: OrderedDict[str, float] = OrderedDict()

    def answered(self, addresses: Iterable[str]) -> None:
        """A step through ``addresses`` was answered now: each of them ran its part."""
        now = self._clock()
        for address in addresses:
            self._answered[address] = now
            self._answered.move_to_end(address)
        while len(self._answered) > self._capacity:
            self._answered.popitem(last=False)

    def moving(self, addresses: Iterable[str], *, since: float, window_s: float) -> bool:
        """Whether every hop in ``addresses`` answered some step after ``since`` and within the
        last ``window_s`` seconds."""
        after = max(since, self._clock() - window_s)
        return all(self._answered.get(address, float("-inf")) > after for address in addresses)
