"""expert.proto for the expert-parallel node and its driver: the service, and the one conversion
between its messages and typed values (the engine's step values, token ids only).

Decoding is strict: an unknown ``want_logits``, a slot or position out of range, a token list
too long, logits whose size or checksum disagrees with their header are refused with a typed
error before the engine sees them.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence
from typing import Literal, cast

import numpy as np

from meshnet.core.errors import IntegrityError, InvalidArgument
from meshnet.moe.ownership import ExpertNumerics
from meshnet.wire.generated import expert_pb2, expert_pb2_grpc

EXPERT_SERVICE = "meshnet.v1.ExpertGroup"
ExpertGroupServicer = expert_pb2_grpc.ExpertGroupServicer
ExpertGroupStub = expert_pb2_grpc.ExpertGroupStub
add_expert_group_servicer = expert_pb2_grpc.add_ExpertGroupServicer_to_server
ExpertRowsFrame = expert_pb2.ExpertRowsFrame
ExpertStepRequest = expert_pb2.ExpertStepRequest
ExpertStepReply = expert_pb2.ExpertStepReply
ExpertReleaseRequest = expert_pb2.ExpertReleaseRequest
ExpertReleaseReply = expert_pb2.ExpertReleaseReply
ExpertNodeQuery = expert_pb2.ExpertNodeQuery
ExpertNodeInfo = expert_pb2.ExpertNodeInfo

_WANT = ("none", "last", "all")
WantLogits = Literal["none", "last", "all"]


@dataclasses.dataclass(frozen=True)
class ExpertStepItem:
    """One session's tokens in a group step (the engine's ``StepInput``, token ids only)."""

    slot: int
    position: int
    tokens: np.ndarray
    """int32 [n]."""
    want_logits: WantLogits = "last"


@dataclasses.dataclass(frozen=True)
class ExpertStepResult:
    slot: int
    logits: np.ndarray
    """float32 [rows, n_vocab]."""
    crc32: int
    """Of the logits' bytes: the nodes of one group must agree on it."""


MAX_STEP_TOKENS = 1 << 16
KEEPALIVE_TIME_MS = 1000
KEEPALIVE_TIMEOUT_MS = 1000
CHANNEL_OPTIONS = [
    # HTTP/2 keepalive for links that die silently. Measured on grpc 1.85 over loopback: a
    # SIGSTOPped peer is NOT detected by it (calls wait for their deadline), so the driver
    # bounds a step by its own liveness probe (moe/group_client.py).
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # The servers must accept those pings, or an idle group (no step for a few seconds) answers
    # GOAWAY too_many_pings and breaks its own row streams (measured before this: after ~40 s).
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
]
"""Options of every expert-group channel and server (node to node, driver to node)."""


@dataclasses.dataclass(frozen=True)
class ExpertNodeDescription:
    index: int
    group_size: int
    model_sha256: str
    n_vocab: int
    n_expert: int
    n_expert_used: int
    max_sessions: int
    context: int
    peers_connected: int
    n_layers: int
    n_embd: int
    exchanges: int = 0
    exchange_p50_us: float = 0.0
    exchange_p95_us: float = 0.0
    frame_bytes_sent: int = 0
    released_expert_bytes: int = 0
    next_step: int = 0
    expert_cache_bytes: int = 0
    expert_cache_hits: int = 0
    expert_cache_misses: int = 0
    expert_cache_bytes_read: int = 0
    numerics: ExpertNumerics | None = None
    """None: the node does not report them (an older node)."""


_SCALAR_FIELDS = tuple(f.name for f in dataclasses.fields(ExpertNodeDescription) if f.name != "numerics")


def node_info_to_proto(info: ExpertNodeDescription) -> expert_pb2.ExpertNodeInfo:
    message = expert_pb2.ExpertNodeInfo(**{name: getattr(info, name) for name in _SCALAR_FIELDS})
    if info.numerics is not None:
        message.numerics.CopyFrom(expert_pb2.ExpertNumerics(**info.numerics.__dict__))
    return message


def node_info_from_proto(message: expert_pb2.ExpertNodeInfo) -> ExpertNodeDescription:
    scalars = {name: getattr(message, name) for name in _SCALAR_FIELDS}
    return ExpertNodeDescription(**scalars, numerics=_numerics_from_proto(message))


def _numerics_from_proto(message: expert_pb2.ExpertNodeInfo) -> ExpertNumerics | None:
    if not message.HasField("numerics"):
        return None
    numerics = message.numerics
    return ExpertNumerics(numerics.prefill_chunk, numerics.flash_attn, numerics.repack)


def step_to_proto(step: int, batch: Sequence[ExpertStepItem]) -> expert_pb2.ExpertStepRequest:
    inputs = []
    for item in batch:
        inputs.append(
            expert_pb2.ExpertStepInput(
                slot=item.slot, position=item.position, tokens=item.tokens.tolist(), want_logits=item.want_logits
            )
        )
    return expert_pb2.ExpertStepRequest(step=step, inputs=inputs)


def step_from_proto(message: expert_pb2.ExpertStepRequest, max_slots: int, context: int) -> list[ExpertStepItem]:
    batch = []
    for item in message.inputs:
        if item.want_logits not in _WANT:
            raise InvalidArgument(f"want_logits {item.want_logits!r} is not one of {', '.join(_WANT)}")
        if item.slot >= max_slots or not 0 < len(item.tokens) <= min(MAX_STEP_TOKENS, context):
            raise InvalidArgument(f"slot {item.slot} or its {len(item.tokens)} tokens are out of range")
        if item.position + len(item.tokens) > context:
            raise InvalidArgument(
                f"positions up to {item.position + len(item.tokens)} exceed the {context}-token context"
            )
        want = cast(WantLogits, item.want_logits)
        batch.append(ExpertStepItem(item.slot, item.position, np.array(item.tokens, np.int32), want))
    if not batch:
        raise InvalidArgument("an expert step with no inputs")
    return batch


def outputs_to_proto(step: int, outputs: Sequence[tuple[int, np.ndarray]]) -> expert_pb2.ExpertStepReply:
    """``(slot, float32 [rows, n_vocab] logits)`` per input."""
    replies = []
    for slot, raw in outputs:
        logits = np.ascontiguousarray(raw, dtype="<f4")
        payload = logits.tobytes()
        replies.append(
            expert_pb2.ExpertStepLogits(slot=slot, rows=logits.shape[0], logits=payload, crc32=zlib.crc32(payload))
        )
    return expert_pb2.ExpertStepReply(step=step, outputs=replies)


def outputs_from_proto(message: expert_pb2.ExpertStepReply, step: int, n_vocab: int) -> list[ExpertStepResult]:
    if message.step != step:
        raise InvalidArgument(f"reply for step {message.step}, expected {step}")
    outputs = []
    for item in message.outputs:
        if len(item.logits) != item.rows * n_vocab * 4:
            raise InvalidArgument(f"logits of {len(item.logits)} bytes for {item.rows} rows of {n_vocab}")
        if zlib.crc32(item.logits) != item.crc32:
            raise IntegrityError("expert step logits failed their crc32")
        logits = np.frombuffer(item.logits, "<f4").reshape(item.rows, n_vocab).astype(np.float32)
        outputs.append(ExpertStepResult(item.slot, logits, item.crc32))
    return outputs
