"""What this shard computed for each session, reported to the tracker when the session ends.

The tracker holds gateways' work records to these counts (``tracker.work_checks``): a record
claiming more tokens than a route's shards computed is disputed, and the record of a request
whose gateway died is completed from them. A shard counts positions (what it appended to the
session's KV: the prompt and every token fed back) and where the first token was sampled (the
prompt's length, as this shard saw it); both come from its own session table, never from a frame's
claim about other hops.
"""

from __future__ import annotations

import asyncio
from collections import deque

from meshnet.core.ids import SessionId
from meshnet.core.tracking import MAX_SESSIONS_PER_REPORT, SessionTokens

MAX_UNREPORTED = 4 * MAX_SESSIONS_PER_REPORT
"""Ended sessions kept while the tracker cannot be reached; the oldest go first beyond it."""


class SessionCounts:
    """Per open session, the position of its first sampled token; ended sessions' counts queued."""

    def __init__(self, limit: int = MAX_UNREPORTED) -> None:
        self._first_token: dict[tuple[SessionId, int], int] = {}
        self._ended: deque[SessionTokens] = deque(maxlen=limit)
        self.ready = asyncio.Event()
        """Set while ended sessions wait to be reported."""

    def sampled(self, key: SessionId, epoch: int, next_position: int) -> None:
        """A step of the session answered a token; the first such step ends its prompt."""
        self._first_token.setdefault((key, epoch), next_position)

    def ended(self, key: SessionId, epoch: int, positions: int) -> None:
        """The session left this shard having filled ``positions``; queue its count."""
        prompt = self._first_token.pop((key, epoch), 0)
        if positions > 0:
            self._ended.append(SessionTokens(key, epoch, positions, min(prompt, positions)))
            self.ready.set()

    def take(self) -> tuple[SessionTokens, ...]:
        """The next batch of ended sessions to report (at most one report's worth)."""
        batch = tuple(self._ended.popleft() for _ in range(min(len(self._ended), MAX_SESSIONS_PER_REPORT)))
        if not self._ended:
            self.ready.clear()
        return batch

    def put_back(self, batch: tuple[SessionTokens, ...]) -> None:
        """A batch the tracker did not take: reported again later (ahead of newer ones)."""
        self._ended.extendleft(reversed(batch))
        if self._ended:
            self.ready.set()
