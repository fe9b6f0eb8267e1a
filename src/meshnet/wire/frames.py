"""Typed frozen values of the shard wire protocol: what worker and client use instead of protobuf.

Every value checks its own structural invariants on construction (so a frame built locally is as
trustworthy as one decoded from the wire); limits that depend on the receiving shard (its n_embd,
its frame budget) live in ``FrameLimits`` and are checked by ``shard_wire.frame_from_proto``.
Nothing here imports grpc or the generated code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from meshnet.core.embedding import EmbeddingSpec
from meshnet.core.errors import InvalidArgument
from meshnet.core.generation import SamplingParams
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.limits import MAX_FRAME_BYTES
from meshnet.core.node_record import NodeRecord
from meshnet.core.prefix import KvPlan
from meshnet.core.sampling_options import TokenLogprobs
from meshnet.core.snapshot import SnapshotPlan
from meshnet.core.tickets import SealedTicket

SCHEMA_VERSION = 1
"""The frame schema this code writes."""
SUPPORTED_SCHEMA_VERSIONS: tuple[int, ...] = (1,)
"""Frame schemas this code reads; a frame of any other version is refused, never guessed at."""
BUNDLE_VERSION = 1
HIDDEN_TENSOR = "hidden"
"""Name of the one tensor in a hidden-state bundle: float32 ``[n_tokens, n_embd]``, row major."""

MAX_POSITION = 2**31 - 1
"""llama.cpp positions are int32, so no token may sit beyond this."""
MAX_STEP = 2**63 - 1
MAX_EPOCH = 2**63 - 1
MAX_TOKEN_ID = 2**31 - 1
MAX_DEADLINE_MS = 2**32 - 1
MAX_ID_CHARS = 128
MAX_ADDRESS_CHARS = 256
DEFAULT_MAX_FRAME_BYTES = MAX_FRAME_BYTES
"""The one limit defined in ``core.limits``, under the name protocol users already import."""
FRAME_OVERHEAD_BYTES = 64 * 1024
"""Room kept in every frame for everything but the payload (header, up to ``max_hops`` hops,
sampling): the payload budget is ``max_frame_bytes - FRAME_OVERHEAD_BYTES``."""

Phase = Literal["prefill", "decode"]
CacheExpectation = Literal["new", "continue"]
"""``new``: start a fresh KV at position 0. ``continue``: KV must already reach ``position``."""
Compression = Literal["none"]

_PHASES = ("prefill", "decode")
_CACHE_EXPECTATIONS = ("new", "continue")


def _check_text(what: str, value: str, limit: int, *, allow_empty: bool = False) -> None:
    if not isinstance(value, str) or (not value and not allow_empty) or len(value) > limit:
        raise InvalidArgument(
            f"{what} must be a {'' if allow_empty else 'non-empty '}string of at "
            f"most {limit} characters, got {str(value)[:40]!r}"
        )


def _check_int(what: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"{what} must be in [{low}, {high}], got {value}")


def check_schema_version(version: int) -> None:
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        raise InvalidArgument(
            f"frame schema version {version} is not supported; this node reads versions "
            f"{', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))}"
        )


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """What a receiving shard accepts; every size is checked against it before allocating."""

    n_embd: int
    """Width of the hidden state the shard's model uses."""
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    """Whole serialized frame; the transport's max receive size should equal it."""
    max_tokens_per_frame: int = 4096
    vocab_size: int | None = None
    """When known (the head), token ids must be below it."""
    max_hops: int = 64

    def __post_init__(self) -> None:
        _check_int("n_embd", self.n_embd, 1, 1 << 20)
        _check_int("max_frame_bytes", self.max_frame_bytes, FRAME_OVERHEAD_BYTES + 1, 2**31 - 1)
        _check_int("max_tokens_per_frame", self.max_tokens_per_frame, 1, MAX_POSITION)
        _check_int("max_hops", self.max_hops, 0, 1024)
        if self.vocab_size is not None:
            _check_int("vocab_size", self.vocab_size, 1, MAX_TOKEN_ID)

    @property
    def max_payload_bytes(self) -> int:
        return self.max_frame_bytes - FRAME_OVERHEAD_BYTES


@dataclass(frozen=True, slots=True)
class FrameMeta:
    """The header of one step frame (the checksum is not here: shard_wire computes and verifies it)."""

    request_id: RequestId
    session_id: SessionId
    route_epoch: int
    fingerprint: str
    """Recipe fingerprint; the receiving shard refuses a different one."""
    layers: LayerRange
    """The layers the receiving shard is asked to run."""
    phase: Phase
    position: int
    """Absolute position of the first token of this frame."""
    step: int
    """Idempotency number, 0, 1, 2, ... per session: a repeated step is answered, not re-run."""
    cache: CacheExpectation
    deadline_ms: int | None = None
    """Remaining budget for this step, or None when the sender gives none."""
    schema_version: int = SCHEMA_VERSION
    compression: Compression = "none"

    def __post_init__(self) -> None:
        check_schema_version(self.schema_version)
        _check_text("request_id", self.request_id, MAX_ID_CHARS)
        _check_text("session_id", self.session_id, MAX_ID_CHARS)
        _check_text("fingerprint", self.fingerprint, MAX_ID_CHARS)
        _check_int("route_epoch", self.route_epoch, 0, MAX_EPOCH)
        _check_int("position", self.position, 0, MAX_POSITION)
        _check_int("step", self.step, 0, MAX_STEP)
        if self.phase not in _PHASES:
            raise InvalidArgument(f"phase must be one of {_PHASES}, got {self.phase!r}")
        if self.cache not in _CACHE_EXPECTATIONS:
            raise InvalidArgument(f"cache must be one of {_CACHE_EXPECTATIONS}, got {self.cache!r}")
        if self.compression != "none":
            raise InvalidArgument(f"compression {self.compression!r} is not supported; use 'none'")
        if self.cache == "new" and self.phase != "prefill":
            # A fresh KV can only be filled by a prefill (from 0, or where reused KV ends: StepFrame).
            raise InvalidArgument(f"cache 'new' needs a prefill, got {self.phase} at {self.position}")
        if self.deadline_ms is not None:
            _check_int("deadline_ms", self.deadline_ms, 1, MAX_DEADLINE_MS)


@dataclass(frozen=True, slots=True)
class HopSpec:
    """A shard after the receiver in the route."""

    address: str
    layers: LayerRange
    fingerprint: str
    node_id: str = ""
    """The node the route put here, pinned in the TLS handshake; empty on an unsecured swarm."""
    ring_batch: bool = False
    """The node advertised ``ring_batch`` (``core.features``): its upstream may send it ring
    batches; False (an older node, or an older sender's frame) keeps every row on its session's
    own stream."""

    def __post_init__(self) -> None:
        _check_text("hop address", self.address, MAX_ADDRESS_CHARS)
        _check_text("hop fingerprint", self.fingerprint, MAX_ID_CHARS)
        if len(self.node_id) > MAX_ID_CHARS:
            raise InvalidArgument(f"hop node id is longer than {MAX_ID_CHARS} characters")


@dataclass(frozen=True, slots=True)
class Continuation:
    """Head-driven decode: the head keeps feeding each sampled token back in by itself."""

    max_steps: int
    """Further decode steps after the frame that carries this."""
    stop_token_ids: frozenset[int] = frozenset()
    """The head stops after a result carrying one of these."""

    def __post_init__(self) -> None:
        _check_int("continuation max_steps", self.max_steps, 0, MAX_POSITION)
        for token in self.stop_token_ids:
            _check_int("stop token id", token, 0, MAX_TOKEN_ID)


@dataclass(frozen=True, slots=True, eq=False)
class StepFrame:
    """One step (or prefill chunk) for one shard. Exactly one of ``tokens`` / ``hidden`` is set.

    Arrays make ``==`` ambiguous, so frames compare by identity; compare fields in tests.
    """

    meta: FrameMeta
    tokens: np.ndarray | None = None
    """Into the head (layers start at 0): int32 ``[n_tokens]``."""
    hidden: np.ndarray | None = None
    """Into any other shard: float32 ``[n_tokens, n_embd]``, the residual after the range before."""
    downstream: tuple[HopSpec, ...] = ()
    """Opening frame only: the hops after the receiver, in route order."""
    sampling: SamplingParams | None = None
    """Opening frame only."""
    final_chunk: bool = True
    """True for decode and for the last prefill chunk of a step: the tail samples only then."""
    continuation: Continuation | None = None
    """Head only, final frames only: decode on without the sender (see ``Continuation``)."""
    ring: bool = False
    """Every frame after a session's opening one (a shard refuses one without), never the opening
    frame: shards after the head answer the tail's token (or chunk ack) over the ring (``node.ring``)."""
    want_timings: bool = False
    """A probe asks every shard on the way for its ``HopTiming``."""
    timings: tuple[HopTiming, ...] = ()
    """On a ring frame with ``want_timings``: the timings of the shards it has passed."""
    ticket: SealedTicket | None = None
    """Opening frame only: the tracker's ticket for the session's route (``core.tickets``), which
    every shard verifies before it opens the session or dials the next hop."""
    kv: KvPlan | None = None
    """Opening frame only: the KV the session reuses and the prefix each shard keeps
    (``core.prefix``); its position is where the reused KV ends."""
    snapshot: SnapshotPlan | None = None
    """Opening frame only: the snapshot of this session every shard restores (``core.snapshot``);
    its position is where the restored KV ends."""
    embedding: EmbeddingSpec | None = None
    """Opening frame only: the tail pools the final chunk's final-norm rows into an embedding
    (``core.embedding``) and answers with it instead of sampling a token."""

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.hidden is None):
            raise InvalidArgument("a frame carries exactly one input: token ids or a hidden state")
        n_tokens = self._check_payload()
        meta = self.meta
        if meta.position + n_tokens - 1 > MAX_POSITION:
            raise InvalidArgument(
                f"tokens at {meta.position}..{meta.position + n_tokens - 1} overflow the position limit {MAX_POSITION}"
            )
        if meta.phase == "decode" and (n_tokens != 1 or not self.final_chunk):
            raise InvalidArgument(
                f"a decode frame carries exactly one token and is final; got {n_tokens} tokens, "
                f"final_chunk={self.final_chunk}"
            )
        self._check_downstream()
        if self.continuation is not None and (self.tokens is None or not self.final_chunk):
            raise InvalidArgument("only a final frame into the head (token input) may ask the head to decode on")
        if self.ring and meta.cache == "new":
            raise InvalidArgument("the opening frame travels on the chain, not on the ring")
        if self.timings and not (self.ring and self.want_timings):
            raise InvalidArgument("only a ring frame that asks for timings carries them")
        if self.ticket is not None and meta.cache != "new":
            raise InvalidArgument("only a session's opening frame carries its route ticket")
        if self.kv is not None and meta.cache != "new":
            raise InvalidArgument("only a session's opening frame carries its KV plan")
        if self.embedding is not None and (meta.cache != "new" or self.continuation is not None):
            raise InvalidArgument("only a session's opening frame asks for an embedding, and nothing is decoded after")
        if self.snapshot is not None and (meta.cache != "new" or self.kv is not None):
            raise InvalidArgument("only an opening frame without a KV plan restores a snapshot")
        if self.snapshot is not None and self.snapshot.position != meta.position:
            raise InvalidArgument(f"a frame at {meta.position} restoring a snapshot of {self.snapshot.position}")
        restored = self.snapshot is not None or (self.kv is not None and self.kv.reused_blocks)
        if meta.cache == "new" and meta.position != 0 and not restored:
            # A fresh KV is filled from its first position, unless the plan restores what precedes.
            raise InvalidArgument(f"cache 'new' needs a prefill at position 0, got one at {meta.position}")

    def _check_payload(self) -> int:
        is_head = self.meta.layers.start == 0
        if self.tokens is not None:
            tokens = self.tokens
            if not is_head:
                raise InvalidArgument(f"layers {self.meta.layers} do not start at 0: the input must be a hidden state")
            if not isinstance(tokens, np.ndarray) or tokens.dtype != np.int32 or tokens.ndim != 1:
                raise InvalidArgument("tokens must be a 1-D int32 array")
            if tokens.size == 0:
                raise InvalidArgument("the frame holds no tokens")
            if int(tokens.min()) < 0:
                raise InvalidArgument("token ids must not be negative")
            return int(tokens.shape[0])
        hidden = self.hidden
        if is_head:
            raise InvalidArgument(f"layers {self.meta.layers} start at 0: the input must be token ids")
        if not isinstance(hidden, np.ndarray) or hidden.dtype != np.float32 or hidden.ndim != 2:
            raise InvalidArgument("the hidden state must be a 2-D float32 array [n_tokens, n_embd]")
        if hidden.shape[0] == 0 or hidden.shape[1] == 0:
            raise InvalidArgument(f"the hidden state is empty: shape {hidden.shape}")
        return int(hidden.shape[0])

    def _check_downstream(self) -> None:
        expected_start = self.meta.layers.stop
        for hop in self.downstream:
            if hop.layers.start != expected_start:
                raise InvalidArgument(
                    f"downstream hop {hop.address} runs {hop.layers}, but the route needs layers "
                    f"from {expected_start}: hops must be contiguous and in order"
                )
            if hop.fingerprint != self.meta.fingerprint:
                raise InvalidArgument(
                    f"downstream hop {hop.address} serves recipe {hop.fingerprint}, not {self.meta.fingerprint}"
                )
            expected_start = hop.layers.stop

    @property
    def n_tokens(self) -> int:
        payload = self.tokens if self.tokens is not None else self.hidden
        return 0 if payload is None else int(payload.shape[0])


@dataclass(frozen=True, slots=True)
class HopTiming:
    address: str
    layers: LayerRange
    queue_us: int
    compute_us: int

    def __post_init__(self) -> None:
        _check_text("timing address", self.address, MAX_ADDRESS_CHARS, allow_empty=True)
        _check_int("queue_us", self.queue_us, 0, 2**63 - 1)
        _check_int("compute_us", self.compute_us, 0, 2**63 - 1)


@dataclass(frozen=True, slots=True)
class StepResult:
    """A shard's answer to one frame: the sampled token, or None for an absorbed prefill chunk."""

    session_id: SessionId
    step: int
    next_position: int
    token_id: int | None
    timings: tuple[HopTiming, ...] = ()
    """This shard first, then each downstream hop."""
    logprobs: TokenLogprobs | None = None
    """The sampled token's logprobs, when the session asked for them."""
    embedding: tuple[float, ...] | None = None
    """An embedding session's answer to its final chunk (float64, as llama-cpp-python's
    ``embed`` returns it): the pooled vector, and no token."""

    def __post_init__(self) -> None:
        _check_text("session_id", self.session_id, MAX_ID_CHARS)
        _check_int("step", self.step, 0, MAX_STEP)
        _check_int("next_position", self.next_position, 0, MAX_POSITION + 1)
        if self.token_id is not None:
            _check_int("token_id", self.token_id, 0, MAX_TOKEN_ID)
        if self.logprobs is not None and self.logprobs.chosen.token_id != self.token_id:
            raise InvalidArgument("logprobs must describe the sampled token")
        if self.embedding is not None and (self.token_id is not None or not self.embedding):
            raise InvalidArgument("an embedding answer carries a non-empty vector and no token")


@dataclass(frozen=True, slots=True)
class CapabilityInfo:
    """A shard's answer to GetCapability, an admin and diagnostic call: the record it registered
    and its room right now. Distinct from the record because the room changes by the second;
    routes carry each hop's capability, so no request needs this."""

    node_id: NodeId
    record: NodeRecord
    schema_versions: tuple[int, ...]
    """Frame schemas the shard reads."""
    free_sessions: int
    """Sessions it can still admit: 0 while draining."""
    active_sessions: int

    def __post_init__(self) -> None:
        _check_text("node_id", self.node_id, MAX_ID_CHARS)
        if not self.schema_versions:
            raise InvalidArgument("a shard must read at least one frame schema version")
        _check_int("free_sessions", self.free_sessions, 0, self.record.capability.max_sessions)
        _check_int("active_sessions", self.active_sessions, 0, 2**32 - 1)


@dataclass(frozen=True, slots=True)
class SessionEnd:
    """A Release or Cancel request: which session to free, and why (for logs)."""

    session_id: SessionId
    reason: str = ""

    def __post_init__(self) -> None:
        _check_text("session_id", self.session_id, MAX_ID_CHARS)
        _check_text("reason", self.reason, 1024, allow_empty=True)
