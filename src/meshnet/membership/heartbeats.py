"""A routable node's standing with the tracker: register, heartbeat, register again, deregister.

Only nodes that serve routes (workers, expert group fronts) run this; every other member only
renews and follows revocations (``membership.upkeep``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from meshnet.core.errors import Cancelled, DeadlineExceeded, FailedPrecondition, MeshnetError, TrackerBusy, Unavailable
from meshnet.core.ids import NodeId
from meshnet.core.node_record import NodeRecord
from meshnet.core.reachability import DeclaredReachability
from meshnet.core.tracking import NodeLoad, Registered
from meshnet.membership.backoff import BusyBackoff, Draw, RefusalBackoff, RejoinDelay
from meshnet.membership.reach import Reach
from meshnet.membership.tracker_client import TrackerClient

logger = logging.getLogger(__name__)

TRACKER_GONE = (Unavailable, DeadlineExceeded, Cancelled)
"""What a call to a tracker that is away, slow or stopping ends with: ask again at the next beat.
A tracker that stops (``--shutdown-grace 0``, or its grace over) ends the calls it has already
received with a bare CANCELLED, which ``wire.status.error_from_rpc`` rebuilds as the client's
``Unreachable`` (an ``Unavailable``); ``Cancelled`` is left only for a tracker that cancels a call
deliberately (with meshnet's metadata). This loop being cancelled raises
``asyncio.CancelledError`` instead, not any of these."""

Pause = Callable[[asyncio.Event, "asyncio.Event | None", float], Awaitable[None]]
"""Waits the given seconds, or less once either event is set (``_pause``; a recorder in tests)."""

DEFAULT_REFUSAL, DEFAULT_BUSY, DEFAULT_REJOIN = RefusalBackoff(), BusyBackoff(), RejoinDelay()

__all__ = ["TRACKER_GONE", "heartbeat_loop"]


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
    backoff: RefusalBackoff = DEFAULT_REFUSAL,
    reach: Reach | None = None,
    busy: BusyBackoff = DEFAULT_BUSY,
    rejoin: RejoinDelay = DEFAULT_REJOIN,
    draw: Draw = random.random,
    pause: Pause | None = None,
) -> None:
    """Keep ``registration`` routable under ``node_id`` until ``stop_event`` is set, then deregister.

    Registers, heartbeats every interval the tracker asks for, and registers again (under the
    same id) whenever the tracker says it forgot us, which is how a worker rejoins after a
    tracker restart. An unreachable tracker, or one that stops mid-call (``TRACKER_GONE``), is
    logged and retried; it never stops the worker (with several replicas the client has moved
    to the next one). A tracker that sheds the call (``TrackerBusy``) is asked again after its
    hint, jittered (``busy``); one that forgot the node is registered with again after a
    jittered fraction of an interval (``rejoin``), so nodes forgotten together (a tracker
    restart, a replica that never knew them) do not all register in the same instant. ``draw``
    is the jitter's random source, ``pause`` how the loop waits (both injected by tests).

    A refusal (a quarantined id) is retried with ``backoff``: the node stays out of routes while
    refused and rejoins by itself once an operator clears it. With ``reach`` the registered
    address is its current one (``membership.reach``: a relay's, for a node behind NAT), and a
    change registers again at once.
    """
    membership = _Membership(client, node_id, registration, load_fn, on_registered, on_probe, reach)
    beats = _Beats(membership, client, on_epoch, backoff, busy, rejoin, draw)
    changed = None if reach is None else reach.changed
    wait = pause or _pause
    while not stop_event.is_set():
        if changed is not None and changed.is_set():
            changed.clear()
            membership.forget()  # the address moved: register the new one now
        wait_s = await beats.one()
        await wait(stop_event, changed, membership.interval_s if wait_s is None else wait_s)
    await membership.leave()


@dataclass
class _Beats:
    """One beat of ``heartbeat_loop`` and how its outcome paces the next: what the loop carries
    from beat to beat (the last epoch told, refusals in a row)."""

    membership: _Membership
    client: TrackerClient
    on_epoch: Callable[[int], None] | None
    backoff: RefusalBackoff
    busy: BusyBackoff
    rejoin: RejoinDelay
    draw: Draw
    last_epoch: int | None = None
    refusals: int = 0

    async def one(self) -> float | None:
        """Register or heartbeat once; the seconds to wait before the next beat (None: the
        tracker's interval, as this beat learnt it)."""
        membership = self.membership
        try:
            return self._paced(await membership.step())
        except TrackerBusy as error:
            wait_s = self.busy.wait_s(error.retry_after_s, self.draw)
            logger.warning("tracker busy (asking again in %.2f s): %s", wait_s, error.message)
            return wait_s
        except TRACKER_GONE as error:
            # The message names the replica that failed; client.address may be the next one.
            logger.warning("tracker unreachable: %s", error.message)
            return None
        except FailedPrecondition as error:
            # Refused (a quarantined id): out of routes until an operator clears it, then back.
            self.refusals += 1
            wait_s = self.backoff.wait_s(self.refusals, membership.interval_s, self.draw)
            logger.error(
                "tracker %s refuses this node (asking again in %.1f s): %s", self.client.address, wait_s, error.message
            )
            return wait_s

    def _paced(self, epoch: int | None) -> float | None:
        """The wait after a beat the tracker answered with ``epoch`` (None: it forgot this node)."""
        if epoch is None:  # forgotten: register again soon, out of step with the others
            return self.rejoin.wait_s(self.membership.interval_s, self.draw)
        if self.on_epoch is not None and epoch != self.last_epoch:
            self.on_epoch(epoch)
        self.last_epoch = epoch
        self.refusals = 0
        return None


async def _pause(stop: asyncio.Event, changed: asyncio.Event | None, timeout_s: float) -> None:
    """Wait ``timeout_s``, or less once ``stop`` or ``changed`` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in (stop, changed) if event is not None]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


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
        reach: Reach | None = None,
    ) -> None:
        self._reach = reach
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

    def forget(self) -> None:
        """Register again at the next step (the node's address moved)."""
        self._registered = False

    async def _register(self) -> int:
        record = self._registration
        declared: DeclaredReachability = "auto"
        if self._reach is not None:
            record, declared = replace(record, address=self._reach.address), self._reach.declaring
        registered = await self._client.register(record, self._node_id, known_epoch=self.known_epoch, declared=declared)
        if registered.node_id != self._node_id:  # a tracker that renames nodes breaks every pinned hop
            raise FailedPrecondition(f"tracker registered node {self._node_id} as {registered.node_id}")
        self._registered, self.interval_s = True, registered.heartbeat_interval_s
        logger.info(
            "registered with tracker %s as %s at %s (%s)",
            self._client.address,
            registered.node_id,
            record.address,
            registered.reachability,
        )
        if self._reach is not None:
            self._reach.registered(registered.reachability)
        if self._on_registered is not None:
            self._on_registered(registered)
        self.known_epoch = max(self.known_epoch, registered.epoch)
        return registered.epoch

    async def leave(self) -> None:
        if self._registered:
            with contextlib.suppress(MeshnetError):
                await self._client.deregister(self._node_id, timeout_s=min(self.interval_s, 1.0))
