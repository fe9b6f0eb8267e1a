"""shard.proto messages <-> meshnet's typed frozen values (``protocol.frames``), one message at a time.

Nothing outside ``meshnet.wire`` reads or builds shard protobuf messages field by field; the
tracker's messages have their twin module in ``tracker_wire``. Each message's encoder and decoder
sit side by side. Decoding never trusts the sender: unknown schema versions and enum values,
malformed sizes, bad checksums and out-of-range numbers all raise typed ``MeshnetError``s (never
``assert``, never a bare exception), and every size is bounded before anything is allocated.
Encoding computes the payload checksum.

Release and Cancel are served for operators and other clients; meshnet's own client ends a
session by closing its stream, so only their server side (request in, reply out) is here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from meshnet.core.errors import InvalidArgument
from meshnet.core.generation import SamplingParams
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.sampling_options import (
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_TOP_LOGPROBS,
    MAX_TRIGGERS,
    LogitAdjustments,
    LogprobRequest,
    OutputConstraint,
    TokenLogprob,
    TokenLogprobs,
)
from meshnet.wire.embedding_wire import (
    embedding_spec_from_proto,
    embedding_spec_to_proto,
    vector_from_proto,
    vector_to_proto,
)
from meshnet.wire.frames import (
    MAX_ID_CHARS,
    CacheExpectation,
    CapabilityInfo,
    Continuation,
    FrameLimits,
    FrameMeta,
    HopSpec,
    HopTiming,
    Phase,
    SessionEnd,
    StepFrame,
    StepResult,
    check_schema_version,
)
from meshnet.wire.generated import shard_pb2 as pb
from meshnet.wire.kv_wire import kv_plan_from_proto, kv_plan_to_proto, snapshot_plan_from_proto, snapshot_plan_to_proto
from meshnet.wire.node_wire import record_from_proto, record_to_proto
from meshnet.wire.payload import decode_hidden, decode_tokens, encode_tokens, write_hidden
from meshnet.wire.ticket_wire import sealed_from_proto, sealed_to_proto

_PHASE_TO_PROTO: dict[Phase, int] = {"prefill": pb.PHASE_PREFILL, "decode": pb.PHASE_DECODE}
_PHASE_FROM_PROTO: dict[int, Phase] = {v: k for k, v in _PHASE_TO_PROTO.items()}
_CACHE_TO_PROTO: dict[CacheExpectation, int] = {
    "new": pb.CACHE_EXPECTATION_NEW,
    "continue": pb.CACHE_EXPECTATION_CONTINUE,
}
_CACHE_FROM_PROTO: dict[int, CacheExpectation] = {v: k for k, v in _CACHE_TO_PROTO.items()}
MAX_METRICS = 4096
MAX_STOP_TOKENS = 1024


# --- step frames --------------------------------------------------------------------------------


def frame_to_proto(frame: StepFrame) -> pb.StepRequest:
    """A frame -> StepRequest, with the payload checksum computed here."""
    meta = frame.meta
    if frame.tokens is not None:
        tokens, crc = encode_tokens(frame.tokens)
        message = pb.StepRequest(tokens=tokens, final_chunk=frame.final_chunk)
    else:
        # StepFrame guarantees exactly one input, so hidden is set here; written in place.
        message = pb.StepRequest(final_chunk=frame.final_chunk)
        crc = write_hidden(message.hidden, np.asarray(frame.hidden))
    header = message.header
    header.schema_version = meta.schema_version
    header.request_id = meta.request_id
    header.session_id = meta.session_id
    header.route_epoch = meta.route_epoch
    header.fingerprint = meta.fingerprint
    header.layers.start = meta.layers.start
    header.layers.stop = meta.layers.stop
    header.phase = _PHASE_TO_PROTO[meta.phase]  # type: ignore[assignment]
    header.position = meta.position
    header.step = meta.step
    header.cache = _CACHE_TO_PROTO[meta.cache]  # type: ignore[assignment]
    header.compression = pb.COMPRESSION_NONE
    header.checksum = crc
    header.deadline_ms = meta.deadline_ms or 0
    for hop in frame.downstream:
        message.downstream.add(
            address=hop.address,
            layers=_span(hop.layers),
            fingerprint=hop.fingerprint,
            node_id=hop.node_id,
            ring_batch=hop.ring_batch,
        )
    if frame.sampling is not None:
        message.sampling.CopyFrom(_sampling_to_proto(frame.sampling))
    if frame.continuation is not None:
        message.continuation.max_steps = frame.continuation.max_steps
        message.continuation.stop_token_ids.extend(sorted(frame.continuation.stop_token_ids))
    if frame.ring:
        message.ring = True
    if frame.want_timings:
        message.want_timings = True
        _add_timings(message.timings, frame.timings)
    if frame.ticket is not None:
        message.ticket.CopyFrom(sealed_to_proto(frame.ticket))
    if frame.kv is not None:
        message.kv.CopyFrom(kv_plan_to_proto(frame.kv))
    if frame.snapshot is not None:
        message.snapshot.CopyFrom(snapshot_plan_to_proto(frame.snapshot))
    if frame.embedding is not None:
        message.embedding.CopyFrom(embedding_spec_to_proto(frame.embedding))
    return message


def frame_from_proto(message: pb.StepRequest, limits: FrameLimits) -> StepFrame:
    """A received StepRequest -> a validated frame, or InvalidArgument / IntegrityError / ..."""
    if not message.HasField("header"):
        raise InvalidArgument("the frame has no header")
    header = message.header
    meta = _meta_from_proto(header)
    which = message.WhichOneof("input")
    tokens = hidden = None
    if which == "tokens":
        tokens = decode_tokens(message.tokens, limits, header.checksum)
    elif which == "hidden":
        hidden = decode_hidden(message.hidden, limits, header.checksum)
    else:
        raise InvalidArgument("the frame carries no input: set tokens or hidden")
    if len(message.downstream) > limits.max_hops:
        raise InvalidArgument(
            f"the frame lists {len(message.downstream)} downstream hops; at most {limits.max_hops} are allowed"
        )
    downstream = tuple(
        HopSpec(hop.address, _range(hop.layers, "downstream hop"), hop.fingerprint, hop.node_id, hop.ring_batch)
        for hop in message.downstream
    )
    sampling = None
    if message.HasField("sampling"):
        sampling = _sampling_from_proto(message.sampling)
    continuation = None
    if message.HasField("continuation"):
        stops = message.continuation.stop_token_ids
        if len(stops) > MAX_STOP_TOKENS:
            raise InvalidArgument(f"at most {MAX_STOP_TOKENS} stop tokens, got {len(stops)}")
        continuation = Continuation(message.continuation.max_steps, frozenset(stops))
    return StepFrame(
        meta=meta,
        tokens=tokens,
        hidden=hidden,
        downstream=downstream,
        sampling=sampling,
        final_chunk=message.final_chunk,
        continuation=continuation,
        ring=message.ring,
        want_timings=message.want_timings,
        timings=_timings_from_proto(message.timings, limits.max_hops) if message.timings else (),
        ticket=sealed_from_proto(message.ticket) if message.HasField("ticket") else None,
        kv=kv_plan_from_proto(message.kv) if message.HasField("kv") else None,
        snapshot=snapshot_plan_from_proto(message.snapshot) if message.HasField("snapshot") else None,
        embedding=embedding_spec_from_proto(message.embedding) if message.HasField("embedding") else None,
    )


def _meta_from_proto(header: pb.FrameHeader) -> FrameMeta:
    # The version first: a newer peer must learn which versions we read, not trip over a field.
    check_schema_version(header.schema_version)
    phase = _PHASE_FROM_PROTO.get(header.phase)
    if phase is None:
        raise InvalidArgument(f"unknown or unspecified phase value {header.phase}")
    cache = _CACHE_FROM_PROTO.get(header.cache)
    if cache is None:
        raise InvalidArgument(f"unknown or unspecified cache expectation value {header.cache}")
    if header.compression != pb.COMPRESSION_NONE:
        raise InvalidArgument(f"unknown or unsupported compression value {header.compression}; only NONE is read")
    if not header.HasField("layers"):
        raise InvalidArgument("the frame header has no layer range")
    return FrameMeta(
        request_id=RequestId(header.request_id),
        session_id=SessionId(header.session_id),
        route_epoch=header.route_epoch,
        fingerprint=header.fingerprint,
        layers=_range(header.layers, "frame"),
        phase=phase,
        position=header.position,
        step=header.step,
        cache=cache,
        deadline_ms=header.deadline_ms or None,
        schema_version=header.schema_version,
    )


def _span(layers: LayerRange) -> pb.LayerSpan:
    return pb.LayerSpan(start=layers.start, stop=layers.stop)


def _range(span: pb.LayerSpan, what: str) -> LayerRange:
    try:
        return LayerRange(span.start, span.stop)
    except InvalidArgument as error:
        raise InvalidArgument(f"{what}: {error.message}") from None


# --- step results -------------------------------------------------------------------------------


def result_to_proto(result: StepResult) -> pb.StepResponse:
    message = pb.StepResponse(session_id=result.session_id, step=result.step, next_position=result.next_position)
    if result.embedding is not None:
        message.embedding.CopyFrom(vector_to_proto(result.embedding))
    elif result.token_id is None:
        message.ack.SetInParent()
    else:
        message.token.token_id = result.token_id
        if result.logprobs is not None:
            message.token.logprobs.CopyFrom(_logprobs_to_proto(result.logprobs))
    if result.timings:
        _add_timings(message.timings, result.timings)
    return message


def _add_timings(into: RepeatedCompositeFieldContainer[pb.HopTiming], timings: Sequence[HopTiming]) -> None:
    for timing in timings:
        into.add(
            address=timing.address, layers=_span(timing.layers), queue_us=timing.queue_us, compute_us=timing.compute_us
        )


def _timings_from_proto(timings: Sequence[pb.HopTiming], max_hops: int) -> tuple[HopTiming, ...]:
    if len(timings) > max_hops + 1:
        raise InvalidArgument(f"the message lists {len(timings)} hop timings")
    return tuple(HopTiming(t.address, _range(t.layers, "hop timing"), t.queue_us, t.compute_us) for t in timings)


def result_from_proto(message: pb.StepResponse, *, max_hops: int = 64) -> StepResult:
    which = message.WhichOneof("result")
    if which is None:
        raise InvalidArgument("the step response carries neither a token nor a chunk ack")
    timings = _timings_from_proto(message.timings, max_hops) if message.timings else ()
    return StepResult(
        session_id=SessionId(message.session_id),
        step=message.step,
        next_position=message.next_position,
        token_id=message.token.token_id if which == "token" else None,
        timings=timings,
        logprobs=_logprobs_from_proto(message.token) if which == "token" else None,
        embedding=vector_from_proto(message.embedding) if which == "embedding" else None,
    )


def ring_open_to_proto(session_id: SessionId, request_id: RequestId) -> pb.RingOpen:
    return pb.RingOpen(session_id=session_id, request_id=request_id)


def ring_open_from_proto(message: pb.RingOpen) -> tuple[SessionId, RequestId]:
    """Which session's ring answers are asked for (the ids are checked like a frame's)."""
    end = SessionEnd(SessionId(message.session_id))
    if not message.request_id or len(message.request_id) > MAX_ID_CHARS:
        raise InvalidArgument("the ring request needs the session's request id")
    return end.session_id, RequestId(message.request_id)


# --- capability, session end, metrics -----------------------------------------------------------


def capability_request_to_proto() -> pb.CapabilityRequest:
    return pb.CapabilityRequest()


def capability_to_proto(info: CapabilityInfo) -> pb.Capability:
    return pb.Capability(
        node_id=info.node_id,
        record=record_to_proto(info.record),
        schema_versions=info.schema_versions,
        free_sessions=info.free_sessions,
        active_sessions=info.active_sessions,
    )


def capability_from_proto(message: pb.Capability) -> CapabilityInfo:
    if len(message.schema_versions) > 64:
        raise InvalidArgument(f"capability lists {len(message.schema_versions)} schema versions")
    if not message.HasField("record"):
        raise InvalidArgument("the capability carries no node record")
    return CapabilityInfo(
        node_id=NodeId(message.node_id),
        record=record_from_proto(message.record),
        schema_versions=tuple(message.schema_versions),
        free_sessions=message.free_sessions,
        active_sessions=message.active_sessions,
    )


def session_end_from_proto(message: pb.ReleaseRequest | pb.CancelRequest) -> SessionEnd:
    """A Release or Cancel request -> which session to free, and why."""
    return SessionEnd(SessionId(message.session_id), message.reason)


def release_reply_to_proto(freed: bool) -> pb.ReleaseResponse:
    return pb.ReleaseResponse(freed=freed)


def cancel_reply_to_proto(freed: bool) -> pb.CancelResponse:
    return pb.CancelResponse(freed=freed)


def metrics_request_to_proto() -> pb.MetricsRequest:
    return pb.MetricsRequest()


def metrics_to_proto(values: Mapping[str, float]) -> pb.MetricsSnapshot:
    return pb.MetricsSnapshot(values={name: float(value) for name, value in values.items()})


def metrics_from_proto(message: pb.MetricsSnapshot) -> dict[str, float]:
    if len(message.values) > MAX_METRICS:
        raise InvalidArgument(f"the metrics snapshot holds {len(message.values)} values")
    return dict(message.values)


# --- sampling options and logprobs (OpenAI parameters at the tail) ------------------------------


def _sampling_to_proto(s: SamplingParams) -> pb.SamplingSpec:
    message = pb.SamplingSpec(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=s.seed, min_p=s.min_p)
    a = s.adjustments
    if a.active:
        message.adjustments.presence_penalty = a.presence_penalty
        message.adjustments.frequency_penalty = a.frequency_penalty
        message.adjustments.repetition_penalty = a.repetition_penalty
        for token, bias in a.logit_bias:
            message.adjustments.logit_bias.add(token_id=token, bias=bias)
    if s.logprobs is not None:
        message.logprobs.top = s.logprobs.top
    if s.constraint is not None:
        message.constraint.gbnf = s.constraint.grammar
        message.constraint.root = s.constraint.root
        message.constraint.triggers.extend(s.constraint.triggers)
    return message


def _sampling_from_proto(s: pb.SamplingSpec) -> SamplingParams:
    adjustments = LogitAdjustments()
    if s.HasField("adjustments"):
        a = s.adjustments
        if len(a.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:  # before building a tuple of them
            raise InvalidArgument(f"logit_bias holds {len(a.logit_bias)} entries; at most {MAX_LOGIT_BIAS_ENTRIES}")
        bias = tuple((entry.token_id, entry.bias) for entry in a.logit_bias)
        adjustments = LogitAdjustments(a.presence_penalty, a.frequency_penalty, bias, a.repetition_penalty or 1.0)
    logprobs = LogprobRequest(s.logprobs.top) if s.HasField("logprobs") else None
    constraint = None
    if s.HasField("constraint"):
        if len(s.constraint.triggers) > MAX_TRIGGERS:  # before building a tuple of them
            raise InvalidArgument(f"a grammar has at most {MAX_TRIGGERS} trigger words")
        constraint = OutputConstraint(s.constraint.gbnf, s.constraint.root or "root", tuple(s.constraint.triggers))
    return SamplingParams(
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        min_p=s.min_p,
        seed=s.seed,
        adjustments=adjustments,
        logprobs=logprobs,
        constraint=constraint,
    )


def _logprobs_to_proto(logprobs: TokenLogprobs) -> pb.SampledLogprobs:
    message = pb.SampledLogprobs(logprob=logprobs.chosen.logprob)
    for entry in logprobs.top:
        message.top.add(token_id=entry.token_id, logprob=entry.logprob)
    return message


def _logprobs_from_proto(token: pb.SampledToken) -> TokenLogprobs | None:
    if not token.HasField("logprobs"):
        return None
    message = token.logprobs
    if len(message.top) > MAX_TOP_LOGPROBS:
        raise InvalidArgument(f"the step response lists {len(message.top)} top logprobs; at most {MAX_TOP_LOGPROBS}")
    top = tuple(TokenLogprob(entry.token_id, entry.logprob) for entry in message.top)
    return TokenLogprobs(TokenLogprob(token.token_id, message.logprob), top)
