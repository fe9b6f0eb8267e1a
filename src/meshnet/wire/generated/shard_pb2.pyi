from meshnet.wire.generated import node_pb2 as _node_pb2
from meshnet.wire.generated import ticket_pb2 as _ticket_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    PHASE_PREFILL: _ClassVar[Phase]
    PHASE_DECODE: _ClassVar[Phase]

class CacheExpectation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_EXPECTATION_UNSPECIFIED: _ClassVar[CacheExpectation]
    CACHE_EXPECTATION_NEW: _ClassVar[CacheExpectation]
    CACHE_EXPECTATION_CONTINUE: _ClassVar[CacheExpectation]

class Compression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_UNSPECIFIED: _ClassVar[Compression]
    COMPRESSION_NONE: _ClassVar[Compression]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
    DTYPE_INT32: _ClassVar[DType]

class ByteOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BYTE_ORDER_UNSPECIFIED: _ClassVar[ByteOrder]
    BYTE_ORDER_LITTLE: _ClassVar[ByteOrder]
    BYTE_ORDER_BIG: _ClassVar[ByteOrder]
PHASE_UNSPECIFIED: Phase
PHASE_PREFILL: Phase
PHASE_DECODE: Phase
CACHE_EXPECTATION_UNSPECIFIED: CacheExpectation
CACHE_EXPECTATION_NEW: CacheExpectation
CACHE_EXPECTATION_CONTINUE: CacheExpectation
COMPRESSION_UNSPECIFIED: Compression
COMPRESSION_NONE: Compression
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_FLOAT16: DType
DTYPE_BFLOAT16: DType
DTYPE_INT32: DType
BYTE_ORDER_UNSPECIFIED: ByteOrder
BYTE_ORDER_LITTLE: ByteOrder
BYTE_ORDER_BIG: ByteOrder

class SnapshotPiece(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class SnapshotKept(_message.Message):
    __slots__ = ("kept",)
    KEPT_FIELD_NUMBER: _ClassVar[int]
    kept: bool
    def __init__(self, kept: _Optional[bool] = ...) -> None: ...

class SnapshotRestore(_message.Message):
    __slots__ = ("position", "tokens_link", "sampled")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_LINK_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    position: int
    tokens_link: bytes
    sampled: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, position: _Optional[int] = ..., tokens_link: _Optional[bytes] = ..., sampled: _Optional[_Iterable[int]] = ...) -> None: ...

class HeldSnapshotsRequest(_message.Message):
    __slots__ = ("fingerprint", "session_id")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    fingerprint: str
    session_id: str
    def __init__(self, fingerprint: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class HeldSnapshotsReply(_message.Message):
    __slots__ = ("positions",)
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, positions: _Optional[_Iterable[int]] = ...) -> None: ...

class KvPlan(_message.Message):
    __slots__ = ("chain", "reused_blocks", "save_blocks", "namespace", "tokens_link")
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    REUSED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SAVE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_LINK_FIELD_NUMBER: _ClassVar[int]
    chain: _containers.RepeatedScalarFieldContainer[bytes]
    reused_blocks: int
    save_blocks: int
    namespace: str
    tokens_link: bytes
    def __init__(self, chain: _Optional[_Iterable[bytes]] = ..., reused_blocks: _Optional[int] = ..., save_blocks: _Optional[int] = ..., namespace: _Optional[str] = ..., tokens_link: _Optional[bytes] = ...) -> None: ...

class HeldKvRequest(_message.Message):
    __slots__ = ("fingerprint", "chain")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    fingerprint: str
    chain: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, fingerprint: _Optional[str] = ..., chain: _Optional[_Iterable[bytes]] = ...) -> None: ...

class HeldKvReply(_message.Message):
    __slots__ = ("blocks",)
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    blocks: int
    def __init__(self, blocks: _Optional[int] = ...) -> None: ...

class LayerSpan(_message.Message):
    __slots__ = ("start", "stop")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    start: int
    stop: int
    def __init__(self, start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...

class NamedTensor(_message.Message):
    __slots__ = ("name", "shape", "dtype", "byte_order", "fragments")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    BYTE_ORDER_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    byte_order: ByteOrder
    fragments: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ..., byte_order: _Optional[_Union[ByteOrder, str]] = ..., fragments: _Optional[_Iterable[bytes]] = ...) -> None: ...

class TensorBundle(_message.Message):
    __slots__ = ("bundle_version", "tensors")
    BUNDLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    bundle_version: int
    tensors: _containers.RepeatedCompositeFieldContainer[NamedTensor]
    def __init__(self, bundle_version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[NamedTensor, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class FrameHeader(_message.Message):
    __slots__ = ("schema_version", "request_id", "session_id", "route_epoch", "fingerprint", "layers", "phase", "position", "step", "cache", "compression", "checksum", "deadline_ms")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    request_id: str
    session_id: str
    route_epoch: int
    fingerprint: str
    layers: LayerSpan
    phase: Phase
    position: int
    step: int
    cache: CacheExpectation
    compression: Compression
    checksum: int
    deadline_ms: int
    def __init__(self, schema_version: _Optional[int] = ..., request_id: _Optional[str] = ..., session_id: _Optional[str] = ..., route_epoch: _Optional[int] = ..., fingerprint: _Optional[str] = ..., layers: _Optional[_Union[LayerSpan, _Mapping]] = ..., phase: _Optional[_Union[Phase, str]] = ..., position: _Optional[int] = ..., step: _Optional[int] = ..., cache: _Optional[_Union[CacheExpectation, str]] = ..., compression: _Optional[_Union[Compression, str]] = ..., checksum: _Optional[int] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class Hop(_message.Message):
    __slots__ = ("address", "layers", "fingerprint", "node_id", "ring_batch")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RING_BATCH_FIELD_NUMBER: _ClassVar[int]
    address: str
    layers: LayerSpan
    fingerprint: str
    node_id: str
    ring_batch: bool
    def __init__(self, address: _Optional[str] = ..., layers: _Optional[_Union[LayerSpan, _Mapping]] = ..., fingerprint: _Optional[str] = ..., node_id: _Optional[str] = ..., ring_batch: _Optional[bool] = ...) -> None: ...

class SamplingSpec(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed", "min_p", "adjustments", "logprobs", "constraint")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    ADJUSTMENTS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    min_p: float
    adjustments: LogitAdjustmentSpec
    logprobs: LogprobSpec
    constraint: GrammarConstraintSpec
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., min_p: _Optional[float] = ..., adjustments: _Optional[_Union[LogitAdjustmentSpec, _Mapping]] = ..., logprobs: _Optional[_Union[LogprobSpec, _Mapping]] = ..., constraint: _Optional[_Union[GrammarConstraintSpec, _Mapping]] = ...) -> None: ...

class LogitAdjustmentSpec(_message.Message):
    __slots__ = ("presence_penalty", "frequency_penalty", "logit_bias", "repetition_penalty")
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    presence_penalty: float
    frequency_penalty: float
    logit_bias: _containers.RepeatedCompositeFieldContainer[LogitBiasEntry]
    repetition_penalty: float
    def __init__(self, presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., logit_bias: _Optional[_Iterable[_Union[LogitBiasEntry, _Mapping]]] = ..., repetition_penalty: _Optional[float] = ...) -> None: ...

class LogitBiasEntry(_message.Message):
    __slots__ = ("token_id", "bias")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    bias: float
    def __init__(self, token_id: _Optional[int] = ..., bias: _Optional[float] = ...) -> None: ...

class LogprobSpec(_message.Message):
    __slots__ = ("top",)
    TOP_FIELD_NUMBER: _ClassVar[int]
    top: int
    def __init__(self, top: _Optional[int] = ...) -> None: ...

class GrammarConstraintSpec(_message.Message):
    __slots__ = ("gbnf", "root", "triggers")
    GBNF_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    TRIGGERS_FIELD_NUMBER: _ClassVar[int]
    gbnf: str
    root: str
    triggers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, gbnf: _Optional[str] = ..., root: _Optional[str] = ..., triggers: _Optional[_Iterable[str]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("header", "tokens", "hidden", "downstream", "sampling", "final_chunk", "continuation", "ticket", "ring", "want_timings", "timings", "kv", "snapshot", "embedding", "leg_incarnation")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    DOWNSTREAM_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    FINAL_CHUNK_FIELD_NUMBER: _ClassVar[int]
    CONTINUATION_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    RING_FIELD_NUMBER: _ClassVar[int]
    WANT_TIMINGS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    LEG_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    header: FrameHeader
    tokens: TokenIds
    hidden: TensorBundle
    downstream: _containers.RepeatedCompositeFieldContainer[Hop]
    sampling: SamplingSpec
    final_chunk: bool
    continuation: Continuation
    ticket: _ticket_pb2.RouteTicket
    ring: bool
    want_timings: bool
    timings: _containers.RepeatedCompositeFieldContainer[HopTiming]
    kv: KvPlan
    snapshot: SnapshotRestore
    embedding: EmbeddingSpec
    leg_incarnation: int
    def __init__(self, header: _Optional[_Union[FrameHeader, _Mapping]] = ..., tokens: _Optional[_Union[TokenIds, _Mapping]] = ..., hidden: _Optional[_Union[TensorBundle, _Mapping]] = ..., downstream: _Optional[_Iterable[_Union[Hop, _Mapping]]] = ..., sampling: _Optional[_Union[SamplingSpec, _Mapping]] = ..., final_chunk: _Optional[bool] = ..., continuation: _Optional[_Union[Continuation, _Mapping]] = ..., ticket: _Optional[_Union[_ticket_pb2.RouteTicket, _Mapping]] = ..., ring: _Optional[bool] = ..., want_timings: _Optional[bool] = ..., timings: _Optional[_Iterable[_Union[HopTiming, _Mapping]]] = ..., kv: _Optional[_Union[KvPlan, _Mapping]] = ..., snapshot: _Optional[_Union[SnapshotRestore, _Mapping]] = ..., embedding: _Optional[_Union[EmbeddingSpec, _Mapping]] = ..., leg_incarnation: _Optional[int] = ...) -> None: ...

class EmbeddingSpec(_message.Message):
    __slots__ = ("pooling", "normalize")
    POOLING_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    pooling: str
    normalize: bool
    def __init__(self, pooling: _Optional[str] = ..., normalize: _Optional[bool] = ...) -> None: ...

class EmbeddingVector(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class StepBatch(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[StepRequest]
    def __init__(self, rows: _Optional[_Iterable[_Union[StepRequest, _Mapping]]] = ...) -> None: ...

class RefusedRow(_message.Message):
    __slots__ = ("session_id", "step", "reason", "leg_incarnation")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEG_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    reason: str
    leg_incarnation: int
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., reason: _Optional[str] = ..., leg_incarnation: _Optional[int] = ...) -> None: ...

class BatchAck(_message.Message):
    __slots__ = ("refused",)
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    refused: _containers.RepeatedCompositeFieldContainer[RefusedRow]
    def __init__(self, refused: _Optional[_Iterable[_Union[RefusedRow, _Mapping]]] = ...) -> None: ...

class RingSubscribe(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[RingOpen]
    def __init__(self, sessions: _Optional[_Iterable[_Union[RingOpen, _Mapping]]] = ...) -> None: ...

class RingEnd(_message.Message):
    __slots__ = ("session_id", "code", "message")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    code: str
    message: str
    def __init__(self, session_id: _Optional[str] = ..., code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class StepResponseBatch(_message.Message):
    __slots__ = ("answers", "ended")
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[StepResponse]
    ended: _containers.RepeatedCompositeFieldContainer[RingEnd]
    def __init__(self, answers: _Optional[_Iterable[_Union[StepResponse, _Mapping]]] = ..., ended: _Optional[_Iterable[_Union[RingEnd, _Mapping]]] = ...) -> None: ...

class RingOpen(_message.Message):
    __slots__ = ("session_id", "request_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: str
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class Continuation(_message.Message):
    __slots__ = ("max_steps", "stop_token_ids")
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    max_steps: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, max_steps: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SampledToken(_message.Message):
    __slots__ = ("token_id", "logprobs")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprobs: SampledLogprobs
    def __init__(self, token_id: _Optional[int] = ..., logprobs: _Optional[_Union[SampledLogprobs, _Mapping]] = ...) -> None: ...

class SampledLogprobs(_message.Message):
    __slots__ = ("logprob", "top")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[SampledAlternative]
    def __init__(self, logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[SampledAlternative, _Mapping]]] = ...) -> None: ...

class SampledAlternative(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class ChunkAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HopTiming(_message.Message):
    __slots__ = ("address", "layers", "queue_us", "compute_us")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_US_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_US_FIELD_NUMBER: _ClassVar[int]
    address: str
    layers: LayerSpan
    queue_us: int
    compute_us: int
    def __init__(self, address: _Optional[str] = ..., layers: _Optional[_Union[LayerSpan, _Mapping]] = ..., queue_us: _Optional[int] = ..., compute_us: _Optional[int] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("session_id", "step", "next_position", "token", "ack", "embedding", "timings")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    NEXT_POSITION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    next_position: int
    token: SampledToken
    ack: ChunkAck
    embedding: EmbeddingVector
    timings: _containers.RepeatedCompositeFieldContainer[HopTiming]
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., next_position: _Optional[int] = ..., token: _Optional[_Union[SampledToken, _Mapping]] = ..., ack: _Optional[_Union[ChunkAck, _Mapping]] = ..., embedding: _Optional[_Union[EmbeddingVector, _Mapping]] = ..., timings: _Optional[_Iterable[_Union[HopTiming, _Mapping]]] = ...) -> None: ...

class CapabilityRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Capability(_message.Message):
    __slots__ = ("node_id", "record", "schema_versions", "free_sessions", "active_sessions")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    FREE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    record: _node_pb2.NodeRecord
    schema_versions: _containers.RepeatedScalarFieldContainer[int]
    free_sessions: int
    active_sessions: int
    def __init__(self, node_id: _Optional[str] = ..., record: _Optional[_Union[_node_pb2.NodeRecord, _Mapping]] = ..., schema_versions: _Optional[_Iterable[int]] = ..., free_sessions: _Optional[int] = ..., active_sessions: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("freed",)
    FREED_FIELD_NUMBER: _ClassVar[int]
    freed: bool
    def __init__(self, freed: _Optional[bool] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("session_id", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("freed",)
    FREED_FIELD_NUMBER: _ClassVar[int]
    freed: bool
    def __init__(self, freed: _Optional[bool] = ...) -> None: ...

class MetricsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MetricsSnapshot(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, float]
    def __init__(self, values: _Optional[_Mapping[str, float]] = ...) -> None: ...
