"""An expert node's tracker link (``--tracker``): the swarm's revocation list, and renewal.

Expert nodes do not register (their front registers the group), yet like every swarm member
they must refuse a revoked certificate and renew their own before it expires (24 h). So a node
heartbeats under its own certificate's node id: the tracker admits that (a node speaks for
itself), answers an unregistered node ``known=false`` and, as to every node, the current revoked
ids. It renews at half its certificate's remaining life, as workers and gateways do.

The node's gRPC server is synchronous (threads), so this runs its own event loop in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from meshnet.core.errors import MeshnetError
from meshnet.core.ids import NodeId
from meshnet.core.tracking import NodeLoad
from meshnet.membership.join import renew_forever
from meshnet.membership.tracker_client import TrackerClient
from meshnet.wire.tls import LinkSecurity

log = logging.getLogger(__name__)

POLL_S = 2.0
"""The tracker's default heartbeat interval: a revocation reaches the group within about this."""


def watch_tracker(
    tracker: str, security: LinkSecurity, on_revoked: Callable[[frozenset[str]], None], stop: threading.Event
) -> threading.Thread:
    """Poll revocations and renew in a daemon thread until ``stop`` is set; returns the thread."""
    thread = threading.Thread(
        target=asyncio.run, args=(_watch(tracker, security, on_revoked, stop),), name="tracker-watch", daemon=True
    )
    thread.start()
    return thread


async def _watch(
    tracker: str, security: LinkSecurity, on_revoked: Callable[[frozenset[str]], None], stop: threading.Event
) -> None:
    stopping = asyncio.Event()
    client = TrackerClient(tracker, security=security)
    tasks = [
        asyncio.create_task(_poll_revocations(client, security, on_revoked, stopping)),
        asyncio.create_task(renew_forever(tracker, security, stopping)),
    ]
    await asyncio.to_thread(stop.wait)
    stopping.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()


async def _poll_revocations(
    client: TrackerClient,
    security: LinkSecurity,
    on_revoked: Callable[[frozenset[str]], None],
    stopping: asyncio.Event,
) -> None:
    reachable: bool | None = None
    while not stopping.is_set():
        try:
            # The node id of the certificate in use now (renewal keeps it): the tracker checks it.
            status = await client.heartbeat(NodeId(security.identity.node_id), NodeLoad(), timeout_s=POLL_S)
            on_revoked(frozenset(status.revoked))
            if reachable is not True:
                log.info("revocation list from the tracker: %d revoked node(s)", len(status.revoked))
            reachable = True
        except MeshnetError as error:
            if reachable is not False:  # once per outage, not every poll
                log.warning("no revocation list from the tracker (%s): keeping the last one", error.message)
            reachable = False
        except Exception:  # a bug here must not end the watch silently: revocations would stop
            log.exception("applying the tracker's revocation list failed; trying again next poll")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=POLL_S)
