"""Shard worker processes for integration tests: start them on port 0, always stop them.

A ``WorkerCluster`` starts ``meshnet worker`` subprocesses (fake model by default) from their typed
configs (``deploy.launch``), reads each one's ready line (``WorkerLine``) with a bounded wait, and
on close sends SIGTERM, waits briefly, then SIGKILLs whatever is left, so a failing test never
leaks a process.
Workers are started by the one process launcher (``meshnet.process``): each holds a lifeline and
ends itself should the test process die first, and spawning runs no Python between fork and exec
(a real fork() in this gRPC-threaded process crashed children). Each worker's stderr goes to a log
file beside its data dir; a start-up failure quotes it.

The async helpers drive routes over real gRPC (the route driver, raw shard streams, metrics
polls) and build the in-process reference a distributed run must equal: the same fake
backends chained by ``LocalRoute``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshnet.core.events import PrefillStarted, RouteHop, TokenGenerated
from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.ids import NodeId, RequestId, SessionId, new_request_id, new_session_id
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import HardwareSummary, NodeCapability, NodeRecord
from meshnet.core.swarm_options import SecurityOptions
from meshnet.core.tickets import DEFAULT_TICKET_S, SealedTicket
from meshnet.core.tracking import NodeWork, WorkRecord
from meshnet.deploy.launch.commands import INSECURE, worker_command
from meshnet.deploy.launch.ready_lines import WorkerLine
from meshnet.engine.certification import certify_fake_engine
from meshnet.engine.fake_backend import FakeBackend
from meshnet.engine.local_route import LocalRoute
from meshnet.node.assembly import fake_recipe
from meshnet.node.config import FakeModel, LayerChoice, WorkerConfig
from meshnet.process.launcher import ChildProcess, LaunchSpec, stop_all
from meshnet.route.driver import RouteDriver
from meshnet.route.route_run import RouteSession
from meshnet.route.shard_admin import describe_hop, fetch_metrics
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.frames import DEFAULT_MAX_FRAME_BYTES, FrameMeta, HopSpec, StepFrame
from meshnet.wire.ticket_wire import PlacedHop, issue_ticket

START_TIMEOUT_S = 20.0
"""A fake worker is ready in well under a second; a real one loads and certifies llama.cpp."""
STOP_TIMEOUT_S = 5.0
FAKE = FakeModel()
"""The fake model ``--fake-layers`` serves: only n_layers and the step delay come from flags."""


@dataclass(frozen=True)
class WorkerSpec:
    layers: LayerRange
    fake_layers: int | None = FAKE.n_layers
    """None serves a real model (``model`` must be set)."""
    model: Path | None = None
    step_delay: float = 0.0
    max_sessions: int | None = None
    context: int | None = None
    threads: int | None = None
    drain_grace: float | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    """Further ``WorkerConfig`` fields (``prefill_chunk``, ``tracker``, ``port``, ...)."""
    security: SecurityOptions = INSECURE
    """These tests drive workers with raw, hand-made frames: plaintext on loopback. The secured
    paths are exercised by swarm_harness swarms and tests/integration/test_security_*.py."""

    def config(self, data_dir: Path) -> WorkerConfig:
        """``data_dir`` is this worker's own: workers starting at once in one data dir race on the
        slice cache's source-hash index (a shared ``.partial`` file)."""
        given: dict[str, Any] = {"port": 0}
        given |= {
            name: value
            for name, value in (
                ("max_sessions", self.max_sessions),
                ("n_ctx_per_session", self.context),
                ("threads", self.threads),
                ("drain_grace", self.drain_grace),
            )
            if value is not None
        }
        fake = None if self.fake_layers is None else FakeModel(n_layers=self.fake_layers, step_delay=self.step_delay)
        return WorkerConfig(
            model=self.model,
            layer_choice=LayerChoice(self.layers),
            data_dir=data_dir,
            fake=fake,
            **{**given, **self.settings},
        )

    def arguments(self, data_dir: Path) -> tuple[str, ...]:
        """The command line (``python -m meshnet worker ...``)."""
        return worker_command(self.config(data_dir), self.security)


class RunningWorker(ChildProcess):
    """A started worker: the launcher's child plus what its ready line says."""

    def __init__(self, spec: WorkerSpec, launch: LaunchSpec) -> None:
        super().__init__(launch)
        self.worker_spec = spec
        self._hop: RouteHop | None = None

    @property
    def log_path(self) -> Path:
        return self.spec.log_path

    @property
    def layers(self) -> LayerRange:
        return self.worker_spec.layers

    @property
    def address(self) -> str:
        return WorkerLine.read(self.ready).address if self.ready is not None else ""

    @property
    def node_id(self) -> str:
        return WorkerLine.read(self.ready).node_id if self.ready is not None else ""

    @property
    def fingerprint(self) -> str:
        return WorkerLine.read(self.ready).recipe if self.ready is not None else ""

    async def hop(self, pool: ChannelPool) -> RouteHop:
        """This worker as a route hop, from the record it describes itself with (GetCapability,
        asked once): these routes are built without a tracker, whose routes carry it."""
        if self._hop is None:
            self._hop = await describe_hop(pool, self.address, NodeId(self.node_id))
        return self._hop

    def stop(self, grace_s: float = STOP_TIMEOUT_S) -> int | None:
        return super().stop(grace_s)


class WorkerCluster:
    """Every worker a test module starts; ``close`` stops them all (use it as a context manager)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.workers: list[RunningWorker] = []
        self._count = 0

    def __enter__(self) -> WorkerCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(
        self, *specs: WorkerSpec, timeout_s: float = START_TIMEOUT_S, program: Sequence[str] | None = None
    ) -> list[RunningWorker]:
        """Start every spec at once and wait until all are serving (in spec order); ``program``
        replaces ``python -m meshnet`` (a test's altered worker)."""
        started = []
        for spec in specs:
            self._count += 1
            name = f"worker-{self._count}-{spec.layers.start}-{spec.layers.stop}"
            data_dir = self.data_dir / name
            data_dir.mkdir(parents=True, exist_ok=True)
            command = spec.arguments(data_dir)
            if program is not None:
                command = (*program, *command[3:])  # the launcher's command starts: python -m meshnet
            launch = LaunchSpec(name, command, self.data_dir / f"{name}.log", WorkerLine.PREFIX)
            worker = RunningWorker(spec, launch)
            self.workers.append(worker)
            started.append(worker)
        deadline = time.monotonic() + timeout_s
        for worker in started:
            worker.await_ready(deadline)
        return started

    def close(self) -> None:
        stop_all(self.workers, STOP_TIMEOUT_S)
        self.workers.clear()


def fake_specs(ranges: Iterable[tuple[int, int]], **options: object) -> list[WorkerSpec]:
    return [WorkerSpec(LayerRange(start, stop), **options) for start, stop in ranges]  # type: ignore[arg-type]


# -- driving routes ------------------------------------------------------------------------------


async def route_session(
    pool: ChannelPool, workers: Sequence[RunningWorker], *, epoch: int = 0, session_id: str | None = None
) -> RouteSession:
    """A session on ``workers`` (head first) with its ticket: unsigned, as the unsecured tracker
    of these insecure workers would issue it."""
    hops = tuple([await worker.hop(pool) for worker in workers])
    request_id = new_request_id()
    session = SessionId(session_id) if session_id else new_session_id()
    fingerprint = workers[0].fingerprint
    ticket = unsigned_ticket(hops, session, request_id=request_id, epoch=epoch, fingerprint=fingerprint)
    return RouteSession(request_id, session, hops, fingerprint, epoch, ticket)


def workers_ticket(workers: Sequence[RunningWorker], session_id: str, request_id: str | None = None) -> SealedTicket:
    """An unsigned ticket for ``session_id`` on ``workers`` in order; a route that does not start at
    layer 0 gets a head that is never dialled (insecure shards check no sender), so a test can
    open a session on a tail directly, as the shard before it would."""
    placed = [HopSpec(w.address, w.layers, w.fingerprint, w.node_id) for w in workers]
    start = workers[0].layers.start
    if start:
        placed.insert(0, HopSpec("127.0.0.1:1", LayerRange(0, start), workers[0].fingerprint, "w-elsewhere"))
    return unsigned_ticket(placed, session_id, fingerprint=workers[0].fingerprint, request_id=request_id)


def unsigned_ticket(
    hops: Sequence[PlacedHop],
    session_id: str,
    *,
    fingerprint: str,
    request_id: str | None = None,
    epoch: int = 0,
    seconds: float = DEFAULT_TICKET_S,
) -> SealedTicket:
    """The ticket an unsecured tracker issues for ``session_id`` on ``hops`` (head first)."""
    return issue_ticket(
        hops,
        session_id=SessionId(session_id),
        request_id=None if request_id is None else RequestId(request_id),
        epoch=epoch,
        fingerprint=fingerprint,
        holder=None,
        now_unix_s=time.time(),
        seconds=seconds,
        signer=None,
    )


def greedy_request(prompt: Sequence[int], max_tokens: int, **options: object) -> GenerationRequest:
    return GenerationRequest(tuple(prompt), max_tokens, SamplingParams(), **options)  # type: ignore[arg-type]


async def generate(
    pool: ChannelPool, driver: RouteDriver, workers: Sequence[RunningWorker], request: GenerationRequest
) -> list[int]:
    """Run ``request`` over ``workers`` and return its tokens."""
    tokens = []
    async for event in driver.run(await route_session(pool, workers), request):
        if isinstance(event, TokenGenerated):
            tokens.append(event.token_id)
    return tokens


async def generate_reusing(
    pool: ChannelPool, driver: RouteDriver, workers: Sequence[RunningWorker], request: GenerationRequest
) -> tuple[list[int], int]:
    """Run ``request`` over ``workers``: its tokens, and the prompt tokens the route reused."""
    tokens, cached = [], -1
    async for event in driver.run(await route_session(pool, workers), request):
        if isinstance(event, PrefillStarted):
            cached = event.cached_tokens
        elif isinstance(event, TokenGenerated):
            tokens.append(event.token_id)
    return tokens, cached


def new_driver(pool: ChannelPool) -> RouteDriver:
    return RouteDriver(pool, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES)


async def metrics(pool: ChannelPool, workers: Sequence[RunningWorker]) -> list[dict[str, float]]:
    return list(await asyncio.gather(*(fetch_metrics(pool, worker.address) for worker in workers)))


async def wait_idle(pool: ChannelPool, workers: Sequence[RunningWorker], within_s: float = 1.0) -> float:
    """Seconds until every worker reports 0 active sessions; AssertionError after ``within_s``."""
    started = time.monotonic()
    while True:
        snapshot = await metrics(pool, workers)
        active = [int(values["active_sessions"]) for values in snapshot]
        elapsed = time.monotonic() - started
        if not any(active):
            return elapsed
        if elapsed > within_s:
            raise AssertionError(f"sessions still open after {within_s} s: {active} on {[w.address for w in workers]}")
        await asyncio.sleep(0.01)


def fake_record(
    layers: LayerRange, address: str, *, n_layers: int = FAKE.n_layers, context: int = 2048, max_sessions: int = 4
) -> NodeRecord:
    """The record a fake worker serving ``layers`` registers, with its fake engine's real
    certification: for tests that talk to a tracker without starting workers."""
    fake = FakeModel(n_layers=n_layers)
    recipe = fake_recipe(fake)
    capability = NodeCapability(
        context, 256, context, DEFAULT_MAX_FRAME_BYTES, fake.n_embd, max_sessions, "cpu", 500.0, 100.0
    )
    certification = certify_fake_engine(n_layers, fake.n_embd, fake.n_vocab).bound_to(recipe.fingerprint())
    hardware = HardwareSummary(2, 1 << 30)
    return NodeRecord(
        address, recipe, recipe.fingerprint(), "tiny", "none", layers, hardware, capability, certification
    )


# -- the in-process reference --------------------------------------------------------------------


def fake_reference(
    ranges: Sequence[LayerRange], request: GenerationRequest, *, n_layers: int = FAKE.n_layers
) -> list[int]:
    """The tokens the same fake shards give when chained in process: what the wire must match."""
    backends = [
        FakeBackend(layers, n_layers, n_embd=FAKE.n_embd, n_vocab=FAKE.n_vocab, max_slots=1, n_ctx_per_slot=2048)
        for layers in ranges
    ]
    route = LocalRoute(backends)
    try:
        return list(route.generate(request))
    finally:
        route.close()


# -- raw frames ----------------------------------------------------------------------------------


def opening_frame(
    workers: Sequence[RunningWorker], session_id: str, tokens: Sequence[int], **meta: object
) -> StepFrame:
    """Step 0 of a session at the head of ``workers``: a prefill that carries hops and sampling."""
    head = workers[0]
    fields: dict[str, object] = {
        "request_id": RequestId("req-" + session_id),
        "session_id": SessionId(session_id),
        "route_epoch": 0,
        "fingerprint": head.fingerprint,
        "layers": head.layers,
        "phase": "prefill",
        "position": 0,
        "step": 0,
        "cache": "new",
    }
    fields.update(meta)
    # The hops follow whatever layers and recipe the header claims, so a misrouted frame is still
    # well formed and reaches the shard's own checks.
    layers, fingerprint = fields["layers"], str(fields["fingerprint"])
    downstream = tuple(
        HopSpec(w.address, w.layers, fingerprint, w.node_id)
        for w in workers[1:]
        if w.layers.start >= layers.stop  # type: ignore[attr-defined]
    )
    meta = FrameMeta(**fields)
    # The ticket of the route ``workers`` make: a misrouted frame fails the shard's own checks,
    # which come before the ticket's.
    placed = [HopSpec(w.address, w.layers, w.fingerprint, w.node_id) for w in workers]
    epoch = meta.route_epoch
    ticket = unsigned_ticket(placed, session_id, fingerprint=head.fingerprint, request_id=meta.request_id, epoch=epoch)
    return StepFrame(
        meta,
        tokens=np.asarray(tokens, np.int32),  # type: ignore[arg-type]
        downstream=downstream,
        sampling=SamplingParams(),
        ticket=ticket,
    )


def decode_frame(opening: StepFrame, *, step: int, position: int, token: int, **meta: object) -> StepFrame:
    """A decode step after ``opening`` into the head: on the ring, as every frame after the opening one."""
    fields: dict[str, object] = {
        "request_id": opening.meta.request_id,
        "session_id": opening.meta.session_id,
        "route_epoch": opening.meta.route_epoch,
        "fingerprint": opening.meta.fingerprint,
        "layers": opening.meta.layers,
        "phase": "decode",
        "position": position,
        "step": step,
        "cache": "continue",
    }
    fields.update(meta)
    return StepFrame(FrameMeta(**fields), tokens=np.array([token], np.int32), ring=True)  # type: ignore[arg-type]


# -- raw bytes on the wire -----------------------------------------------------------------------

SESSION_METHOD = "/meshnet.v1.Shard/Session"
RAW_MAX_BYTES = 64 * 1024 * 1024
"""A raw channel sends more than any worker accepts, so the worker's own limit is what is tested."""


@dataclass(frozen=True)
class RawOutcome:
    code: grpc.StatusCode
    details: str
    seconds: float
    """From the first write to the final status."""
    responses: tuple[bytes, ...]


def raw_channel(address: str) -> grpc.aio.Channel:
    options = [("grpc.max_send_message_length", RAW_MAX_BYTES), ("grpc.max_receive_message_length", RAW_MAX_BYTES)]
    return grpc.aio.insecure_channel(address, options=options)


async def raw_session(channel: grpc.aio.Channel, messages: Sequence[bytes], timeout_s: float = 2.0) -> RawOutcome:
    """Send serialized frames on a fresh Session stream, one answer read per frame, then close.

    Identity serializers: the bytes go out exactly as given, however malformed.
    """
    call = channel.stream_stream(SESSION_METHOD)(timeout=timeout_s)
    responses: list[bytes] = []
    started = time.monotonic()
    try:
        for message in messages:
            await call.write(message)
            answer = await call.read()
            if answer is grpc.aio.EOF:
                break
            responses.append(answer)
        else:
            await call.done_writing()
            await call.read()
    except (grpc.RpcError, asyncio.InvalidStateError):
        pass  # the status below says why
    code = await call.code()
    details = await call.details()
    return RawOutcome(code, details or "", time.monotonic() - started, tuple(responses))


async def health_status(channel: grpc.aio.Channel, service: str = "") -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
    return int(reply.status)


def sample_work_record(request_id: str) -> WorkRecord:
    """A completed two-share record whose content varies with its id, so a mixed-up row would
    not compare equal: for tests that report work to a tracker without running a request."""
    tokens = len(request_id)
    return WorkRecord(
        request_id=RequestId(request_id),
        model="tiny",
        status="completed",
        tokens_in=tokens,
        tokens_out=2 * tokens,
        attribution=(
            NodeWork(NodeId("n-a"), LayerRange(0, 3), 3 * tokens),
            NodeWork(NodeId("n-b"), LayerRange(3, 6), 3 * tokens),
        ),
        billing_units=tokens / 1000,
        started_at=1_700_000_000.0,
        finished_at=1_700_000_001.0,
    )
