"""A routable node's standing with the tracker: register, heartbeat, register again, deregister.

Only nodes that serve routes (workers, expert group fronts) run this; every other member only
renews and follows revocations (``membership.upkeep``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from meshnet.core.errors import DeadlineExceeded, FailedPrecondition, MeshnetError, Unavailable
from meshnet.core.ids import NodeId
from meshnet.core.node_record import NodeRecord
from meshnet.core.tracking import NodeLoad, Registered
from meshnet.membership.tracker_client import TrackerClient

logger = logging.getLogger(__name__)


async def heartbeat_loop(
    client: TrackerClient,
    node_id: NodeId,
    registration: NodeRecord,
    load_fn: Callable[[], NodeLoad],
    stop_event: asyncio.Event,
    *,
    on_registered: Callable[[Registered], None] | None = None,
    on_epoch: Callable[[int], None] | None = None,
    on_probe: Callable[[tuple[str, ...]], None] | None = None,
) -> None:
    """Keep ``registration`` routable under ``node_id`` until ``stop_event`` is set, then deregister.

    Registers, heartbeats every interval the tracker asks for, and registers again (under the
    same id) whenever the tracker says it forgot us, which is how a worker rejoins after a
    tracker restart. An unreachable tracker is logged and retried; it never stops the worker.
    """
    membership = _Membership(client, node_id, registration, load_fn, on_registered, on_probe)
    last_epoch: int | None = None
    while not stop_event.is_set():
        try:
            epoch = await membership.step()
            if epoch is None:
                continue  # forgotten: register again at once
            if on_epoch is not None and epoch != last_epoch:
                on_epoch(epoch)
            last_epoch = epoch
        except (Unavailable, DeadlineExceeded) as error:
            logger.warning("tracker %s unreachable: %s", client.address, error.message)
        except FailedPrecondition as error:
            # Refused for good (a quarantined id): retrying cannot help, and this node must stay dark.
            logger.error("tracker %s refuses this node: %s", client.address, error.message)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_event.wait(), timeout=membership.interval_s)
    await membership.leave()


class _Membership:
    """One node's standing with one tracker: registered or not, how often to beat."""

    def __init__(
        self,
        client: TrackerClient,
        node_id: NodeId,
        registration: NodeRecord,
        load_fn: Callable[[], NodeLoad],
        on_registered: Callable[[Registered], None] | None,
        on_probe: Callable[[tuple[str, ...]], None] | None,
    ) -> None:
        self._client = client
        self._node_id = node_id
        self._registration = registration
        self._load_fn = load_fn
        self._on_registered = on_registered
        self._on_probe = on_probe
        self._registered = False
        self.interval_s = 1.0
        self.known_epoch = 0
        """The highest epoch the tracker told us: the routes this node refuses are older, so a
        tracker that restarted without its state must move above it (sent at registration)."""

    async def step(self) -> int | None:
        """Register or heartbeat once: the tracker's epoch, or None when it forgot this node."""
        if not self._registered:
            return await self._register()
        # A reply later than one interval is worth nothing: the next beat is due.
        status = await self._client.heartbeat(self._node_id, self._load_fn(), timeout_s=self.interval_s)
        if not status.known:
            logger.warning("tracker %s forgot %s; registering again", self._client.address, self._node_id)
            self._registered = False
            return None
        if self._on_probe is not None:
            self._on_probe(status.probe)
        self.known_epoch = max(self.known_epoch, status.epoch)
        return status.epoch

    async def _register(self) -> int:
        registered = await self._client.register(self._registration, self._node_id, known_epoch=self.known_epoch)
        if registered.node_id != self._node_id:  # a tracker that renames nodes breaks every pinned hop
            raise FailedPrecondition(f"tracker registered node {self._node_id} as {registered.node_id}")
        self._registered, self.interval_s = True, registered.heartbeat_interval_s
        logger.info("registered with tracker %s as %s", self._client.address, registered.node_id)
        if self._on_registered is not None:
            self._on_registered(registered)
        self.known_epoch = max(self.known_epoch, registered.epoch)
        return registered.epoch

    async def leave(self) -> None:
        if self._registered:
            with contextlib.suppress(MeshnetError):
                await self._client.deregister(self._node_id, timeout_s=min(self.interval_s, 1.0))
