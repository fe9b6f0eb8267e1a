"""Valid sample frames and limits for the protocol tests: small, so thousands of cases run fast."""

from __future__ import annotations

import zlib

import numpy as np
from google.protobuf.message import DecodeError

from meshnet.core.errors import InvalidArgument, ResourceExhausted
from meshnet.core.generation import SamplingParams
from meshnet.core.ids import RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import Certification, HardwareSummary, NodeCapability, NodeRecord
from meshnet.core.recipe import Recipe
from meshnet.wire.frames import (
    FRAME_OVERHEAD_BYTES,
    CacheExpectation,
    FrameLimits,
    FrameMeta,
    HopSpec,
    Phase,
    StepFrame,
)
from meshnet.wire.generated import shard_pb2 as pb
from meshnet.wire.shard_wire import frame_from_proto

N_EMBD = 8
N_LAYERS = 12
RECIPE = Recipe("cd" * 32, "llama", "1", "Q8_0", "f32", "f16", "llama.cpp", "0.3.36", N_LAYERS, N_EMBD)
FINGERPRINT = "rcp-" + "ab" * 16
HEAD_LAYERS = LayerRange(0, 4)
LIMITS = FrameLimits(
    n_embd=N_EMBD,
    max_frame_bytes=FRAME_OVERHEAD_BYTES + 4096,
    max_tokens_per_frame=64,
    vocab_size=1000,
    max_hops=8,
)


def make_meta(
    layers: LayerRange = HEAD_LAYERS,
    phase: Phase = "prefill",
    position: int = 0,
    step: int = 0,
    cache: CacheExpectation = "new",
    deadline_ms: int | None = 2500,
) -> FrameMeta:
    return FrameMeta(
        request_id=RequestId("req-1"),
        session_id=SessionId("s-1"),
        route_epoch=7,
        fingerprint=FINGERPRINT,
        layers=layers,
        phase=phase,
        position=position,
        step=step,
        cache=cache,
        deadline_ms=deadline_ms,
    )


def downstream_after(layers: LayerRange) -> tuple[HopSpec, ...]:
    """The hops that complete a route of N_LAYERS after ``layers``, in 4-layer spans."""
    hops, start = [], layers.stop
    while start < N_LAYERS:
        stop = min(start + 4, N_LAYERS)
        hops.append(HopSpec(f"127.0.0.1:{50000 + start}", LayerRange(start, stop), FINGERPRINT))
        start = stop
    return tuple(hops)


def token_frame(ids: tuple[int, ...] = (1, 2, 3), *, opening: bool = True, **meta: object) -> StepFrame:
    m = make_meta(**meta)  # type: ignore[arg-type]
    return StepFrame(
        meta=m,
        tokens=np.array(ids, dtype=np.int32),
        downstream=downstream_after(m.layers) if opening else (),
        sampling=SamplingParams(temperature=0.7, top_k=40, top_p=0.9, seed=11) if opening else None,
        final_chunk=True,
    )


def hidden_frame(rows: int = 3, seed: int = 0, *, opening: bool = True, **meta: object) -> StepFrame:
    meta.setdefault("layers", LayerRange(4, 8))
    m = make_meta(**meta)  # type: ignore[arg-type]
    hidden = np.random.default_rng(seed).standard_normal((rows, N_EMBD), dtype=np.float32)
    return StepFrame(
        meta=m,
        hidden=hidden,
        downstream=downstream_after(m.layers) if opening else (),
        sampling=SamplingParams(temperature=0.0) if opening else None,
        final_chunk=True,
    )


def rechecksum(message: pb.StepRequest) -> None:
    """Make the header checksum match the (possibly tampered) payload, to isolate other checks."""
    if message.WhichOneof("input") == "tokens":
        data = np.array(message.tokens.ids, dtype="<i4").tobytes()
    elif message.WhichOneof("input") == "hidden":
        data = b"".join(f for t in message.hidden.tensors for f in t.fragments)
    else:
        data = b""
    message.header.checksum = zlib.crc32(data)


def decode_bytes(raw: bytes, limits: FrameLimits = LIMITS) -> StepFrame:
    """Serialized StepRequest bytes -> a frame, the way a worker receives them.

    The worker's transport refuses a message over ``max_frame_bytes`` (RESOURCE_EXHAUSTED) and
    parses the rest; ``ShardServicer`` turns a parse error into INVALID_ARGUMENT; then
    ``frame_from_proto`` validates. This does the same in-process.
    """
    if len(raw) > limits.max_frame_bytes:
        raise ResourceExhausted(f"the frame is {len(raw)} bytes; this shard accepts at most {limits.max_frame_bytes}")
    try:
        message = pb.StepRequest.FromString(raw)
    except DecodeError as error:
        raise InvalidArgument(f"the frame is not a valid StepRequest: {error}") from None
    return frame_from_proto(message, limits)


def sample_record(layers: LayerRange = HEAD_LAYERS, *, context: int = 2048) -> NodeRecord:
    """A node's record as a worker of ``RECIPE`` serving ``layers`` would register it."""
    fingerprint = RECIPE.fingerprint()
    return NodeRecord(
        address="10.0.0.2:7000",
        recipe=RECIPE,
        fingerprint=fingerprint,
        model="tiny",
        quantization="Q8_0",
        layers=layers,
        hardware=HardwareSummary(cpu_count=4, memory_bytes=8 << 30),
        capability=NodeCapability(context, 256, context, 4 << 20, N_EMBD, 8, "cpu", 900.0, 90.0),
        certification=Certification.seal(fingerprint, "0.3.36", ("prefill bit-identical",), "ab" * 32, "ab" * 32),
    )
