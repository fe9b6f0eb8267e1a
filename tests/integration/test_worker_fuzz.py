"""W9 on a live worker: over a thousand generated malformed frames, sent as raw bytes.

Pass figure: 0 crashes (the process lives, answers GetCapability and serves a valid session
afterwards), 0 hangs (every call ends well inside its 2 s budget), 0 KV mutations (a refused
frame runs nothing on the engine and leaves no session), and every status is one the status
contract names for bad input, never UNKNOWN or INTERNAL. The cases are derandomized
(a fixed sequence every run), so a failure reproduces.

The workers run the fake backend (``worker_harness``'s default): real processes, gRPC, engine loops
and batching, without llama.cpp. Malformed frames are refused before any engine step, so the fake
engine hides nothing of the refusal; llama.cpp's own input checks are
tests/unit/engine/test_engine_backend_validation.py.
"""

from __future__ import annotations

import asyncio
import math
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from worker_harness import (
    RunningWorker,
    WorkerCluster,
    fake_reference,
    fake_specs,
    generate,
    greedy_request,
    new_driver,
    opening_frame,
    raw_channel,
    raw_session,
    workers_ticket,
)

from meshnet.core.generation import SamplingParams
from meshnet.core.ids import RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.route.shard_admin import fetch_capability, fetch_metrics
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.frames import DEFAULT_MAX_FRAME_BYTES, FrameMeta, StepFrame
from meshnet.wire.generated import shard_pb2 as pb
from meshnet.wire.shard_wire import frame_to_proto

pytestmark = pytest.mark.timeout(120)

EXAMPLES = 1300
REQUIRED_MALFORMED = 1000
CALL_BUDGET_S = 2.0
HANG_S = 1.0
N_EMBD = 16
BAD_INPUT = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    # An opening frame whose header or hops no longer match its route ticket (ticket_refused).
    grpc.StatusCode.PERMISSION_DENIED,
}
U64 = st.integers(0, 2**64 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class Case:
    target: str
    kind: str
    payload: bytes
    surely_malformed: bool
    """False for blind damage (truncation, bit flips), which may happen to leave a valid frame."""


@dataclass
class Outcome:
    case: Case
    code: grpc.StatusCode
    seconds: float
    engine_work: float
    """Prefill tokens + decode steps the engine ran for this frame."""
    active_sessions: int


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningWorker]]:
    with WorkerCluster(tmp_path_factory.mktemp("fuzz-workers")) as cluster:
        full, tail = cluster.start(*fake_specs([(0, 6), (4, 6)]))
        yield {"full": full, "tail": tail}


def valid_frames(targets: dict[str, RunningWorker]) -> dict[str, pb.StepRequest]:
    full, tail = targets["full"], targets["tail"]
    tail_meta = FrameMeta(
        RequestId("req-fuzz"), SessionId("fuzz"), 0, tail.fingerprint, tail.layers, "prefill", 0, 0, "new"
    )
    return {
        "full": frame_to_proto(opening_frame([full], "fuzz", [1, 2, 3, 4, 5])),
        "tail": frame_to_proto(
            StepFrame(
                tail_meta,
                hidden=np.ones((3, N_EMBD), np.float32),
                sampling=SamplingParams(),
                ticket=workers_ticket([tail], "fuzz"),
            )
        ),
    }


def reseal(message: pb.StepRequest) -> None:
    """A correct checksum, so the structural damage is what the worker must find."""
    if message.WhichOneof("input") == "tokens":
        message.header.checksum = zlib.crc32(np.asarray(message.tokens.ids, "<i4").tobytes())
    elif message.WhichOneof("input") == "hidden":
        crc = 0
        for tensor in message.hidden.tensors[:1]:
            for fragment in tensor.fragments:
                crc = zlib.crc32(fragment, crc)
        message.header.checksum = crc


def _header(draw: st.DrawFn, m: pb.StepRequest) -> None:
    header = m.header
    field = draw(
        st.sampled_from(
            [
                "schema_version",
                "phase",
                "cache",
                "compression",
                "position",
                "step",
                "checksum",
                "layers",
                "fingerprint",
                "session_id",
                "request_id",
                "no header",
            ]
        )
    )
    if field == "schema_version":
        header.schema_version = draw(st.integers(0, 2**32 - 1).filter(lambda v: v != 1))
    elif field in ("phase", "cache"):
        setattr(header, field, draw(I32.filter(lambda v: v not in (1, 2))))
    elif field == "compression":
        header.compression = draw(I32.filter(lambda v: v != 1))  # type: ignore[assignment]
    elif field in ("position", "step"):
        setattr(header, field, draw(st.integers(1, 2**64 - 1)))
    elif field == "checksum":
        header.checksum = draw(st.integers(0, 2**32 - 1).filter(lambda v: v != header.checksum))
    elif field == "layers":
        old = (header.layers.start, header.layers.stop)
        start, stop = draw(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)).filter(lambda p: p != old))
        header.layers.start, header.layers.stop = start, stop
    elif field == "fingerprint":
        header.fingerprint = draw(st.text(max_size=200).filter(lambda v: v != header.fingerprint))
    elif field in ("session_id", "request_id"):
        setattr(header, field, draw(st.sampled_from(["", "x" * 129, "y" * 5000])))
    else:
        m.ClearField("header")


def _tokens(draw: st.DrawFn, m: pb.StepRequest) -> None:
    good = st.integers(0, 63)
    bad = st.one_of(st.integers(-(2**31), -1), st.integers(64, 2**31 - 1))
    ids = draw(
        st.one_of(
            st.just([]),
            st.lists(good, max_size=8).flatmap(lambda head: bad.map(lambda b: [*head, b])),
            st.integers(2049, 2100).map(lambda n: [1] * n),  # more than a frame may carry
        )
    )
    m.tokens.ids[:] = ids
    reseal(m)


def _hidden(draw: st.DrawFn, m: pb.StepRequest) -> None:
    tensor = m.hidden.tensors[0]
    field = draw(
        st.sampled_from(["shape", "dtype", "byte_order", "data", "nan", "name", "version", "count", "fragments"])
    )
    if field == "shape":
        tensor.shape[:] = draw(st.lists(U64, max_size=4).filter(lambda s: s != [3, N_EMBD]))
    elif field == "dtype":
        tensor.dtype = draw(I32.filter(lambda v: v != pb.DTYPE_FLOAT32))
    elif field == "byte_order":
        tensor.byte_order = draw(I32.filter(lambda v: v not in (pb.BYTE_ORDER_LITTLE, pb.BYTE_ORDER_BIG)))
    elif field == "data":
        tensor.fragments[:] = [draw(st.binary(max_size=400).filter(lambda b: len(b) != 3 * N_EMBD * 4))]
    elif field == "nan":
        values = np.ones(3 * N_EMBD, "<f4")
        values[draw(st.integers(0, 3 * N_EMBD - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        tensor.fragments[:] = [values.tobytes()]
    elif field == "name":
        tensor.name = draw(st.text(max_size=50).filter(lambda v: v != "hidden"))
    elif field == "version":
        m.hidden.bundle_version = draw(st.integers(0, 2**32 - 1).filter(lambda v: v != 1))
    elif field == "count":
        extra = m.hidden.tensors.add()
        extra.CopyFrom(tensor)
    else:
        data = np.ones(3 * N_EMBD, "<f4").tobytes()
        tensor.fragments[:] = [data[i : i + 1] for i in range(len(data))] * 6  # too many, and too long
    reseal(m)


def _sampling(draw: st.DrawFn, m: pb.StepRequest) -> None:
    field = draw(st.sampled_from(["temperature", "top_p", "top_k", "missing"]))
    if field == "temperature":
        m.sampling.temperature = draw(
            st.one_of(st.floats(max_value=-1e-9), st.floats(min_value=100.001), st.just(math.nan))
        )
    elif field == "top_p":
        m.sampling.top_p = draw(st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0001), st.just(math.nan)))
    elif field == "top_k":
        m.sampling.top_k = draw(st.integers(1_000_001, 2**32 - 1))
    else:
        m.ClearField("sampling")


def _downstream(draw: st.DrawFn, m: pb.StepRequest) -> None:
    # Only loopback addresses: a worker must refuse these hops before dialing anything.
    count = draw(st.sampled_from([1, 2, 65]))
    for _ in range(count):
        hop = m.downstream.add(address="127.0.0.1:1", fingerprint=draw(st.sampled_from([m.header.fingerprint, "f"])))
        hop.layers.start, hop.layers.stop = draw(st.sampled_from([(0, 1), (2, 2), (7, 3), (1, 6)]))


def _swap_input(draw: st.DrawFn, m: pb.StepRequest) -> None:
    if m.WhichOneof("input") == "tokens":
        m.hidden.CopyFrom(valid_hidden_bundle())
    else:
        m.tokens.ids[:] = [1, 2, 3]
    reseal(m)


def valid_hidden_bundle() -> pb.TensorBundle:
    frame = StepFrame(
        FrameMeta(RequestId("r"), SessionId("s"), 0, "f", _TAIL_LAYERS, "prefill", 0, 0, "new"),
        hidden=np.ones((3, N_EMBD), np.float32),
    )
    return frame_to_proto(frame).hidden


_TAIL_LAYERS = LayerRange(4, 6)
STRUCTURED: dict[str, Callable[[st.DrawFn, pb.StepRequest], None]] = {
    "header": _header,
    "sampling": _sampling,
    "downstream": _downstream,
    "swap input": _swap_input,
}


def malformed_cases(bases: dict[str, pb.StepRequest]) -> st.SearchStrategy[Case]:
    @st.composite
    def build(draw: st.DrawFn) -> Case:
        target = draw(st.sampled_from(["full", "tail"]))
        raw = bases[target].SerializeToString()
        kind = draw(st.sampled_from(["truncate", "flip", "random bytes", "payload", *STRUCTURED]))
        if kind == "truncate":
            return Case(target, kind, raw[: draw(st.integers(0, len(raw) - 1))], False)
        if kind == "flip":
            damaged = bytearray(raw)
            for index, mask in draw(
                st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(1, 255)), min_size=1, max_size=4)
            ):
                damaged[index] ^= mask
            return Case(target, kind, bytes(damaged), False)
        if kind == "random bytes":
            return Case(target, kind, draw(st.binary(max_size=300)), False)
        message = pb.StepRequest()
        message.CopyFrom(bases[target])
        if kind == "payload":
            (_tokens if target == "full" else _hidden)(draw, message)
        else:
            STRUCTURED[kind](draw, message)
        return Case(target, kind, message.SerializeToString(), True)

    return build()


async def _send(
    case: Case,
    channels: dict[str, grpc.aio.Channel],
    pool: ChannelPool,
    workers: dict[str, RunningWorker],
    before: float,
) -> tuple[Outcome, float]:
    outcome = await raw_session(channels[case.target], [case.payload], timeout_s=CALL_BUDGET_S)
    values = await fetch_metrics(pool, workers[case.target].address)
    work = values["prefill_tokens_total"] + values["decode_steps_total"]
    return Outcome(case, outcome.code, outcome.seconds, work - before, int(values["active_sessions"])), work


def test_a_thousand_malformed_frames_crash_hang_and_mutate_nothing(targets: dict[str, RunningWorker]) -> None:
    loop = asyncio.new_event_loop()
    try:
        _fuzz(loop, targets)
    finally:
        loop.close()


def _fuzz(loop: asyncio.AbstractEventLoop, targets: dict[str, RunningWorker]) -> None:
    async def connect() -> tuple[dict[str, grpc.aio.Channel], ChannelPool]:
        return {name: raw_channel(w.address) for name, w in targets.items()}, ChannelPool(DEFAULT_MAX_FRAME_BYTES)

    channels, pool = loop.run_until_complete(connect())
    work: dict[str, float] = {}
    for name, worker in targets.items():
        values = loop.run_until_complete(fetch_metrics(pool, worker.address))
        work[name] = values["prefill_tokens_total"] + values["decode_steps_total"]
    outcomes: list[Outcome] = []

    @settings(
        max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(case=malformed_cases(valid_frames(targets)))
    def send_one(case: Case) -> None:
        outcome, work[case.target] = loop.run_until_complete(_send(case, channels, pool, targets, work[case.target]))
        outcomes.append(outcome)
        assert outcome.code in BAD_INPUT | {grpc.StatusCode.OK}, f"{case.kind}: {outcome.code.name}"
        assert outcome.seconds < HANG_S, f"{case.kind}: answered after {outcome.seconds:.2f} s"
        assert outcome.active_sessions == 0, f"{case.kind}: a session was left open"
        if case.surely_malformed:
            assert outcome.code != grpc.StatusCode.OK, f"{case.kind} was accepted"
        if outcome.code != grpc.StatusCode.OK:
            assert outcome.engine_work == 0, f"{case.kind}: a refused frame ran on the engine"

    try:
        send_one()

        # The same workers still serve: capability, a valid session with exact tokens.
        async def afterwards() -> tuple[list[int], int]:
            for worker in targets.values():
                await fetch_capability(pool, worker.address)
            request = greedy_request([1, 2, 3, 4, 5], 12)
            tokens = await generate(pool, new_driver(pool), [targets["full"]], request)
            tail = await raw_session(channels["tail"], [valid_frames(targets)["tail"].SerializeToString()])
            return tokens, tail.code.value[0]

        tokens, tail_code = loop.run_until_complete(afterwards())
    finally:
        loop.run_until_complete(pool.close())
        for channel in channels.values():
            loop.run_until_complete(channel.close())

    refused = [o for o in outcomes if o.code != grpc.StatusCode.OK]
    codes = Counter(o.code.name for o in outcomes)
    kinds = Counter(o.case.kind for o in refused)
    print(
        f"\n{len(outcomes)} frames, {len(refused)} refused; slowest answer "
        f"{max(o.seconds for o in outcomes) * 1000:.1f} ms; statuses {dict(codes)}; refused by kind {dict(kinds)}"
    )
    assert len(refused) >= REQUIRED_MALFORMED
    assert all(w.process.poll() is None for w in targets.values()), "a worker died"
    assert tokens == fake_reference([LayerRange(0, 6)], greedy_request([1, 2, 3, 4, 5], 12))
    assert tail_code == 0
