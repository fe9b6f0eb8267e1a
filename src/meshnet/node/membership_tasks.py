"""A worker's standing with the tracker while it serves, all through ``meshnet.membership``.

With ``--tracker`` the worker, under its one node id:
- registers and heartbeats its load, with the round trips to the candidate next hops the
  tracker asks it to measure (``PeerProber``), and deregisters when it stops;
- renews its certificate and follows the revocation list (secured only, ``membership.upkeep``);
- keeps the artifacts it fetched announced to the tracker's directory;
- reports what each session computed here once it ended (``node.session_counts``), the counts
  the tracker holds gateways' work records to;
- behind NAT (``--reachability private``, or ``auto`` once the tracker found its address
  unreachable) with ``--relay``s: stays attached to one relay (``meshnet.relay.attach``) and
  registers ``NODE@RELAY``, again at once whenever the attachment moves (``membership.reach``).
Every call goes over one ``TrackerClient``, so all of it follows a renewal at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from meshnet.core.errors import MeshnetError, TrackerBusy
from meshnet.core.tracking import MAX_PREFIX_TIPS, NodeLoad, Registered
from meshnet.membership.announce import announce_forever
from meshnet.membership.backoff import BusyBackoff
from meshnet.membership.heartbeats import heartbeat_loop
from meshnet.membership.reach import Reach
from meshnet.membership.tracker_client import TrackerClient
from meshnet.membership.upkeep import upkeep_tasks
from meshnet.node.assembly import AssembledWorker
from meshnet.node.peers import PeerProber
from meshnet.node.snapshot_peers import SnapshotPeers
from meshnet.relay.attach import attach
from meshnet.route.shard_stream import ChannelPool

log = logging.getLogger(__name__)


async def keep_membership(
    worker: AssembledWorker, stop: asyncio.Event, on_registered: Callable[[Registered], None] | None = None
) -> None:
    """Run every membership task of ``worker`` until ``stop`` (nothing without a tracker)."""
    if not worker.config.tracker:
        return
    # Keyed by the node's id, so the swarm's workers spread over the tracker's replicas.
    client = TrackerClient(
        worker.config.tracker,
        security=worker.security,
        replica_key=worker.shard.node_id,
        order=worker.config.tracker_order,
    )
    probes = ChannelPool(worker.config.max_frame_bytes, worker.security)
    prober = PeerProber(probes)
    relaying = _Relaying(worker, stop, on_registered)
    tasks = [
        asyncio.create_task(_heartbeats(worker, client, prober, stop, relaying), name="heartbeats"),
        asyncio.create_task(prober.run(stop), name="peer-probes"),
        asyncio.create_task(_report_session_tokens(worker, client, stop), name="session-tokens"),
        *upkeep_tasks(client, worker.security, stop),
    ]
    peers = worker.shard.kv.snapshots.peers
    if peers is not None and worker.shard.kv.snapshots.enabled:
        tasks.append(asyncio.create_task(_snapshot_peers(peers, client, stop), name="snapshot-peers"))
    if worker.held_artifacts is not None:
        # Peers fetch from the address they can dial: a relayed one, or none while private.
        announcing = announce_forever(client, worker.held_artifacts, stop, address=lambda: relaying.reach.dialable)
        tasks.append(asyncio.create_task(announcing, name="announce"))
    try:
        for task, outcome in zip(tasks, await asyncio.gather(*tasks, return_exceptions=True), strict=True):
            if isinstance(outcome, Exception):
                log.error("membership task %s failed: %r", task.get_name(), outcome)
    finally:
        await relaying.close()
        await probes.close()
        await client.close()


class _Relaying:
    """The worker's relay attachment, started once it is private (declared, or told so)."""

    def __init__(
        self, worker: AssembledWorker, stop: asyncio.Event, on_registered: Callable[[Registered], None] | None
    ) -> None:
        config = worker.config
        self.reach = Reach(worker.registration.address, config.reachability, config.relay)
        self._worker = worker
        self._stop = stop
        self._on_registered = on_registered
        self._task: asyncio.Task[None] | None = None
        self._warned = False
        self._start_if_wanted()

    def registered(self, registered: Registered) -> None:
        self._start_if_wanted()  # ``auto``: the tracker's dial-back found the address unreachable
        if registered.reachability == "private" and not self.reach.relays and not self._warned:
            self._warned = True
            log.warning(
                "registered private: the tracker could not dial %s (behind NAT, or --reachability private) and "
                "no --relay carries this worker, so no route passes through it until a dial-back succeeds "
                "(it registers again with backoff); behind NAT, give --relay HOST:PORT[,...]",
                self.reach.direct,
            )
        if self._on_registered is not None:
            self._on_registered(registered)

    def _start_if_wanted(self) -> None:
        if self._task is not None or not self.reach.wants_relay or self._stop.is_set():
            return
        worker = self._worker
        log.info("behind NAT: attaching to relay %s", ", ".join(self.reach.relays))
        attaching = attach(self.reach.relays, worker.listen_address, worker.security, self.reach.moved)
        self._task = asyncio.create_task(attaching, name="relay-attach")

    async def close(self) -> None:
        self.reach.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


async def _heartbeats(
    worker: AssembledWorker,
    client: TrackerClient,
    prober: PeerProber,
    stop: asyncio.Event,
    relaying: _Relaying,
) -> None:
    shard = worker.shard

    def load() -> NodeLoad:
        # Only a head announces what it holds: routes are chosen by their head (tracker.affinity).
        tips = tuple(shard.kv.store.tips(MAX_PREFIX_TIPS)) if shard.shape.takes_tokens else ()
        return shard.metrics().node_load(prober.latest(), tips)

    await heartbeat_loop(
        client,
        shard.node_id,
        worker.registration,
        load,
        stop,
        on_registered=relaying.registered,
        on_epoch=shard.raise_min_epoch,
        on_probe=prober.set_targets,
        reach=relaying.reach,
    )


PEER_REFRESH_S = 5.0
"""How often the peer that keeps copies of this worker's snapshots is looked up again."""


async def _snapshot_peers(peers: SnapshotPeers, client: TrackerClient, stop: asyncio.Event) -> None:
    """Keep the snapshot peer current from the tracker's node table (``node.snapshot_peers``)."""
    while not stop.is_set():
        try:
            peers.update(await client.list_nodes(timeout_s=PEER_REFRESH_S))
        except MeshnetError as error:
            log.info("snapshot peer not looked up: %s", error.message)
        with contextlib.suppress(TimeoutError):
            # Sooner while none is known: the peer may be a worker that is still registering.
            await asyncio.wait_for(stop.wait(), PEER_REFRESH_S if peers.peer is not None else 1.0)


REPORT_BACKOFF_S = (0.2, 5.0)
"""First and longest wait before reporting session counts again after a failed report."""


async def _report_session_tokens(worker: AssembledWorker, client: TrackerClient, stop: asyncio.Event) -> None:
    """Send each batch of ended sessions' counts as soon as there is one; keep it on failure."""
    shard = worker.shard
    counts = shard.counts
    delay, longest = REPORT_BACKOFF_S
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            ready = asyncio.ensure_future(counts.ready.wait())
            await asyncio.wait({ready, stopping}, return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
            batch = counts.take()
            if not batch:
                continue
            try:
                await client.report_session_tokens(shard.node_id, batch, timeout_s=5.0)
                delay = REPORT_BACKOFF_S[0]
            except MeshnetError as error:
                counts.put_back(batch)
                log.warning("could not report %d session count(s) to the tracker: %s", len(batch), error.message)
                # A tracker that shed the report said when to come back: its hint, jittered.
                wait_s = BusyBackoff().wait_s(error.retry_after_s) if isinstance(error, TrackerBusy) else delay
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(stopping), wait_s)
                delay = min(delay * 2, longest)
    finally:
        stopping.cancel()
