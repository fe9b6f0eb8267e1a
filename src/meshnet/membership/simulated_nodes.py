"""Simulated nodes for tracker load tests: what a worker says to the tracker, without a model.

Each node is what the tracker sees of a real one: its own worker certificate (minted here by the
swarm admin, as ``meshnet up`` mints its nodes), its own gRPC channel and TCP connection, a
record of one model's layer range, and an address where it answers the tracker's dial-back
under its own certificate (one health server bound on one port per node, each port with that
node's credentials). It registers, heartbeats at the interval the tracker asks for with a list
of peer round trips, registers again when told it is unknown, waits as long as a busy tracker's
retry hint asks (``TrackerBusy``), and moves to the next tracker address when one is unavailable:
the tracker cannot tell it from a worker by anything but its speed. (It mirrors
``membership.heartbeats.heartbeat_loop`` rather than running it, to time each call: a change to
how workers retry belongs here too.)

Nothing here decides anything; it counts. ``load_generator`` drives these and reads the counts.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from meshnet.core.addresses import TrackerOrder
from meshnet.core.errors import TrackerBusy
from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import Certification, HardwareSummary, NodeCapability, NodeRecord
from meshnet.core.recipe import Recipe
from meshnet.core.tracking import DEFAULT_HEARTBEAT_TRANSPORT, HeartbeatTransport, NodeLoad
from meshnet.membership.beat_streams import BeatStreamEnded, BeatStreams
from meshnet.membership.load_figures import Histogram, bucket
from meshnet.membership.replicas import replica_order
from meshnet.security.certificates import NodeCertificate
from meshnet.security.identity import TRACKER_NAME
from meshnet.wire import services
from meshnet.wire.status import error_from_rpc
from meshnet.wire.tls import LinkSecurity, channel_options
from meshnet.wire.tracker_wire import (
    heartbeat_status_from_proto,
    heartbeat_to_proto,
    registered_from_proto,
    registration_to_proto,
)

MODEL = "scale-sim"
N_EMBD = 64
PEERS_PER_HEARTBEAT = 12
"""A worker reports round trips to the candidate next hops it was asked to probe; 12 is what a
node of a large swarm carries."""
SEPARATE_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
"""gRPC shares one connection among channels to the same target by default; a node has its own."""
REGISTER_TIMEOUT_S = 10.0
"""A registration waits for the tracker's dial-back (3 s deadline) behind other dial-backs."""


def simulated_recipe(n_layers: int) -> Recipe:
    return Recipe("5e" * 32, "llama", "1", "Q8_0", "f32", "f16", "llama.cpp", "0.3.36", n_layers, N_EMBD)


def simulated_record(address: str, layers: LayerRange, recipe: Recipe) -> NodeRecord:
    """A record as a CPU worker of ``recipe`` serving ``layers`` would register it."""
    fingerprint = recipe.fingerprint()
    certification = Certification.seal(fingerprint, recipe.backend_version, ("simulated",), "ab" * 32, "ab" * 32)
    capability = NodeCapability(2048, 256, 2048, 4 << 20, N_EMBD, 8, "cpu", 500.0, 100.0)
    return NodeRecord(
        address, recipe, fingerprint, MODEL, "Q8_0", layers, HardwareSummary(4, 8 << 30), capability, certification
    )


def layer_ranges(n_nodes: int, n_layers: int, rng: random.Random) -> list[LayerRange]:
    """Ranges of 2-10 layers tiling the model again and again, so every few nodes form a route."""
    ranges: list[LayerRange] = []
    start = 0
    while len(ranges) < n_nodes:
        stop = min(start + rng.randint(2, 10), n_layers)
        if n_layers - stop < 2:  # never leave a tail shorter than the smallest range
            stop = n_layers
        ranges.append(LayerRange(start, stop))
        start = 0 if stop == n_layers else stop
    return ranges


@dataclass
class Counts:
    """What the simulated side saw: latencies by call, errors by call and status, and lateness."""

    latencies: dict[str, Histogram] = field(default_factory=dict)
    """Latency histograms by call (``load_figures``: bounded however long the run)."""
    errors: Counter[str] = field(default_factory=Counter)
    error_examples: dict[str, str] = field(default_factory=dict)
    """The details of the first error of each call and status, to tell one cause from another."""
    unknown_replies: int = 0
    """Heartbeats of a node this generator kept heartbeating that the tracker answered "unknown"."""
    reregistrations: int = 0
    skipped_records: int = 0
    """Work records not sent because no route had been answered yet."""
    loop_lag: Histogram = field(default_factory=Counter)
    """How late the generator's event loop woke a sleeper: its own lag, apart from the tracker's."""
    retries: int = 0
    """Gateway calls asked once more on the next replica (theirs was gone)."""
    failed_calls: Counter[str] = field(default_factory=Counter)
    """Gateway calls that failed for good (after their one retry, or not retried), by call."""
    phase_latencies: dict[str, Histogram] = field(default_factory=dict)
    """Latencies since the last ``new_phase`` (a kill), by call, besides the whole span's."""

    def reset(self) -> None:
        """Forget everything counted so far: the end of the warm-up."""
        self.latencies, self.errors, self.error_examples, self.loop_lag = {}, Counter(), {}, Counter()
        self.unknown_replies = self.reregistrations = self.skipped_records = 0
        self.retries, self.failed_calls, self.phase_latencies = 0, Counter(), {}

    def new_phase(self) -> dict[str, Histogram]:
        """The latencies of the phase that ends now; a new one starts."""
        ended, self.phase_latencies = self.phase_latencies, {}
        return ended

    def latency(self, call: str, started: float) -> None:
        index = bucket((time.perf_counter() - started) * 1000.0)
        self.latencies.setdefault(call, Counter())[index] += 1
        self.phase_latencies.setdefault(call, Counter())[index] += 1

    def error(self, call: str, error: grpc.aio.AioRpcError) -> None:
        self.failed(call, error.code().name, error.details() or "")

    def failed(self, call: str, status: str, details: str) -> None:
        key = f"{call}:{status}"
        self.errors[key] += 1
        self.error_examples.setdefault(key, details[:200])


class AnsweringPorts:
    """One health server answering on one port per node, each under that node's certificate: the
    address each simulated node registers, where the tracker's dial-back finds it."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._server = grpc.aio.server()
        self._health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)

    def bind(self, security: LinkSecurity | None) -> str:
        target = f"{self._host}:0"
        port = (
            self._server.add_insecure_port(target)
            if security is None
            else self._server.add_secure_port(target, security.server_credentials())
        )
        return f"{self._host}:{port}"

    async def start(self) -> None:
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop(0)


def tracker_channel(address: str, security: LinkSecurity | None) -> grpc.aio.Channel:
    """A channel of its own (its own TCP connection) to the tracker, as one process opens it."""
    if security is None:
        return grpc.aio.insecure_channel(address, options=SEPARATE_CONNECTION)
    options = [*SEPARATE_CONNECTION, *channel_options(TRACKER_NAME)]
    return grpc.aio.secure_channel(address, security.channel_credentials(), options=options)


class SimulatedNode:
    """One worker's membership traffic: register, heartbeat on schedule, register again if forgotten."""

    def __init__(
        self,
        node_id: NodeId,
        certificate: NodeCertificate | None,
        record: NodeRecord,
        trackers: tuple[str, ...],
        counts: Counts,
        transport: HeartbeatTransport = DEFAULT_HEARTBEAT_TRANSPORT,
        order: TrackerOrder = "spread",
    ) -> None:
        self.node_id = node_id
        self.transport = transport
        """As a worker's client: "stream" until a tracker answers UNIMPLEMENTED, then "unary"."""
        self._beats = BeatStreams()
        self.security = None if certificate is None else LinkSecurity(certificate)
        self.record = record
        # The replicas in this node's own order, as a worker's ``TrackerClient`` ranks them by
        # its node id: the simulated swarm spreads over the replicas the way a real one does.
        ranked = range(len(trackers)) if order == "listed" else replica_order(node_id, trackers)
        self._trackers = tuple(trackers[index] for index in ranked)
        self._tracker_index = 0
        self._counts = counts
        self._channel: grpc.aio.Channel | None = None
        self.interval_s = 2.0
        self.registered = False
        self.peers: tuple[tuple[str, float], ...] = ()
        self.hold_until = 0.0
        """A busy tracker's retry hint: no call before this (``time.monotonic``)."""
        self.answered_at = 0.0
        """When a tracker last answered this node's heartbeat (``time.monotonic``)."""

    def _stub(self) -> services.TrackerStub:
        return services.TrackerStub(self._open_channel())

    def _open_channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = tracker_channel(self._trackers[self._tracker_index], self.security)
        return self._channel

    async def _fail_over(self) -> None:
        """Move to the next tracker address (a replica), as a client with several addresses does."""
        if len(self._trackers) > 1 and self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._tracker_index = (self._tracker_index + 1) % len(self._trackers)

    async def _failed(self, call: str, error: grpc.aio.AioRpcError) -> None:
        """Count it; wait as long as a busy tracker asks (as a worker does); move on from a dead one."""
        self._counts.error(call, error)
        typed = error_from_rpc(error)
        if isinstance(typed, TrackerBusy):
            self.hold_until = time.monotonic() + typed.retry_after_s
        elif error.code() == grpc.StatusCode.UNAVAILABLE:
            await self._fail_over()

    async def register(self) -> bool:
        started = time.perf_counter()
        try:
            reply = await self._stub().Register(
                registration_to_proto(self.record, self.node_id), timeout=REGISTER_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as error:
            await self._failed("register", error)
            return False
        self._counts.latency("register", started)
        registered = registered_from_proto(reply)
        self.interval_s, self.registered = registered.heartbeat_interval_s, True
        return True

    async def heartbeat(self) -> None:
        load = NodeLoad(active_sessions=1, free_sessions=7, queue_depth=0, kv_used_fraction=0.1, peer_rtt_ms=self.peers)
        started = time.perf_counter()
        try:
            # As a worker does: a reply later than one interval is worth nothing.
            reply = await self._beat(heartbeat_to_proto(self.node_id, load))
        except grpc.aio.AioRpcError as error:
            if self.transport == "stream" and error.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.transport = "unary"  # an older tracker, as ``TrackerClient.heartbeat`` does
            await self._failed("heartbeat", error)
            return
        except (TimeoutError, BeatStreamEnded) as error:  # the stream's own ends (``beat_streams``)
            self._counts.failed(
                "heartbeat", "DEADLINE_EXCEEDED" if isinstance(error, TimeoutError) else "ENDED", str(error)
            )
            return
        self._counts.latency("heartbeat", started)
        self.answered_at = time.monotonic()
        if not heartbeat_status_from_proto(reply).known:
            self._counts.unknown_replies += 1
            self.registered = False
            if await self.register():
                self._counts.reregistrations += 1

    async def _beat(self, request: services.NodeHeartbeat) -> services.HeartbeatReply:
        if self.transport == "unary":
            return await self._stub().Heartbeat(request, timeout=self.interval_s)
        return await self._beats.beat(self._open_channel(), self._tracker_index, request, self.interval_s)

    async def run(self, stop: asyncio.Event, start_delay_s: float) -> None:
        """Register after ``start_delay_s``, then heartbeat every interval on a fixed schedule,
        awaiting each reply as a worker does (a reply takes at most one interval); register again
        on the next beat when a registration failed."""
        due = time.monotonic() + start_delay_s
        while not stop.is_set():
            delay = due - time.monotonic()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    return
                except TimeoutError:
                    pass
            if self.registered:
                await self.heartbeat()
            else:
                await self.register()
            due = max(due + self.interval_s, time.monotonic(), self.hold_until)

    async def close(self) -> None:
        self._beats.close()
        if self._channel is not None:
            await self._channel.close()
