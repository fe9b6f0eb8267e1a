"""An expert node's tracker link (``--tracker``): the swarm's revocation list, and renewal.

Expert nodes do not register (their front registers the group, under the front's own id), so
they never heartbeat: a heartbeat would claim a routable node that does not exist. Like every
swarm member they must still refuse a revoked certificate and renew their own before it expires
(24 h), so each runs the upkeep every secured member runs (``membership.upkeep``): a
WatchRevocations stream, which hands the whole list over at once and again on every change, and
renewal at half its certificate's remaining life.

The node's gRPC server is synchronous (threads), so this runs its own event loop in a thread;
``watch_tracker_until`` is the same upkeep for a caller that already runs an event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from meshnet.membership.tracker_client import TrackerClient
from meshnet.membership.upkeep import upkeep_tasks
from meshnet.wire.tls import LinkSecurity

log = logging.getLogger(__name__)


def watch_tracker(
    tracker: str, security: LinkSecurity, on_revoked: Callable[[frozenset[str]], None], stop: threading.Event
) -> threading.Thread:
    """Follow revocations and renew in a daemon thread until ``stop`` is set; returns the thread."""
    thread = threading.Thread(
        target=asyncio.run, args=(_watch(tracker, security, on_revoked, stop),), name="tracker-watch", daemon=True
    )
    thread.start()
    return thread


async def _watch(
    tracker: str, security: LinkSecurity, on_revoked: Callable[[frozenset[str]], None], stop: threading.Event
) -> None:
    stopping = asyncio.Event()
    waiter = asyncio.create_task(asyncio.to_thread(stop.wait))
    waiter.add_done_callback(lambda _: stopping.set())
    await watch_tracker_until(tracker, security, on_revoked, stopping)
    await waiter


async def watch_tracker_until(
    tracker: str, security: LinkSecurity, on_revoked: Callable[[frozenset[str]], None], stop: asyncio.Event
) -> None:
    """Follow revocations (``on_revoked`` gets each whole list) and renew until ``stop``."""
    client = TrackerClient(tracker, security=security)
    try:
        tasks = upkeep_tasks(client, security, stop, on_revoked=on_revoked)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for failure in (r for r in results if isinstance(r, BaseException)):
            log.error("the tracker watch ended with an error: %r", failure)
    finally:
        await client.close()
