"""Follow the swarm's revocation list: one WatchRevocations stream per process, kept open.

Every member that serves peers (workers, seeders, expert nodes) must refuse a revoked
certificate. The tracker sends the whole list when the watch opens and again after every
change, so a revocation reaches every member within a round trip, and a watch reopened after
an outage starts from the whole list again (nothing is missed). One mechanism for every role:
workers no longer read it from heartbeat replies, and expert nodes, which are not routable
nodes, no longer heartbeat to get it.

Why a stream rather than a polled unary call (``scripts/bench_revocation_watch.py``, 50 members
against one tracker process on the 2-core dev machine, load ~5): 50 open watches cost the
tracker 20 ms of CPU per 20 s (keepalive pings; idle tracker: 10 ms), 50 members polling a
small unary call every 2 s cost it 820 ms per 20 s, 40 times more, for a list that changes a
few times in a swarm's life; and a revocation reached all 50 watchers in 20 ms, where polling
delays it by up to the poll interval. The price is one long-lived stream per member, which the
tracker ends when it stops (so it never waits out its shutdown grace) and which a member opens
again, with backoff, after any failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from meshnet.core.errors import MeshnetError, TrackerBusy
from meshnet.membership.backoff import BusyBackoff
from meshnet.membership.tracker_client import TrackerClient

log = logging.getLogger(__name__)

RETRY_S = (0.2, 5.0)
"""First and longest wait before opening the watch again after it failed or ended."""


async def follow_revocations(
    client: TrackerClient, on_revoked: Callable[[frozenset[str]], None], stop: asyncio.Event
) -> None:
    """Call ``on_revoked`` with the whole list now and after every change, until ``stop``.

    Survives anything: an unreachable tracker is retried with backoff (the last list stays in
    force meanwhile), and an error in ``on_revoked`` is logged, never the end of the watch."""
    watch = _Watch(client, on_revoked)
    while not stop.is_set():
        running = asyncio.create_task(watch.once())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=watch.retry_s)


class _Watch:
    """One watch at a time, and what its failures say about when to open the next."""

    def __init__(self, client: TrackerClient, on_revoked: Callable[[frozenset[str]], None]) -> None:
        self._client = client
        self._on_revoked = on_revoked
        self._reachable: bool | None = None
        self.retry_s = RETRY_S[0]

    async def once(self) -> None:
        """Apply lists until the stream ends; never raises (but for cancellation)."""
        try:
            async for revoked in self._client.watch_revocations():
                self._on_revoked(revoked)
                if self._reachable is not True:
                    log.info("following the tracker's revocation list: %d revoked node(s)", len(revoked))
                self._reachable, self.retry_s = True, RETRY_S[0]
        except MeshnetError as error:
            if self._reachable is not False:  # once per outage, not every retry
                log.warning("revocation watch failed (%s): keeping the last list", error.message)
            self._reachable = False
            if isinstance(error, TrackerBusy):  # the tracker said when: its hint, jittered
                self.retry_s = BusyBackoff().wait_s(error.retry_after_s)
            else:
                self.retry_s = min(self.retry_s * 2, RETRY_S[1])
        except Exception:  # a bug here must not end the watch silently: revocations would stop
            log.exception("applying the tracker's revocation list failed; watching again")
