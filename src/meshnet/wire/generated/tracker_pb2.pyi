from meshnet.wire.generated import node_pb2 as _node_pb2
from meshnet.wire.generated import ticket_pb2 as _ticket_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeRegistration(_message.Message):
    __slots__ = ("record", "node_id", "known_epoch", "reachability")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    KNOWN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REACHABILITY_FIELD_NUMBER: _ClassVar[int]
    record: _node_pb2.NodeRecord
    node_id: str
    known_epoch: int
    reachability: str
    def __init__(self, record: _Optional[_Union[_node_pb2.NodeRecord, _Mapping]] = ..., node_id: _Optional[str] = ..., known_epoch: _Optional[int] = ..., reachability: _Optional[str] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("node_id", "heartbeat_interval_ms", "epoch", "reachability")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REACHABILITY_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    heartbeat_interval_ms: int
    epoch: int
    reachability: str
    def __init__(self, node_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., epoch: _Optional[int] = ..., reachability: _Optional[str] = ...) -> None: ...

class NodeHeartbeat(_message.Message):
    __slots__ = ("node_id", "active_sessions", "free_sessions", "queue_depth", "kv_used_fraction", "peers", "memory_used_bytes", "memory_budget_bytes", "prefix_tips", "prefix_reported", "prefix_bytes", "prefix_budget_bytes", "prefix_hits", "prefix_misses")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    FREE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    KV_USED_FRACTION_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TIPS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_REPORTED_FIELD_NUMBER: _ClassVar[int]
    PREFIX_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HITS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_MISSES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    active_sessions: int
    free_sessions: int
    queue_depth: int
    kv_used_fraction: float
    peers: _containers.RepeatedCompositeFieldContainer[PeerLatency]
    memory_used_bytes: int
    memory_budget_bytes: int
    prefix_tips: _containers.RepeatedCompositeFieldContainer[PrefixTip]
    prefix_reported: bool
    prefix_bytes: int
    prefix_budget_bytes: int
    prefix_hits: int
    prefix_misses: int
    def __init__(self, node_id: _Optional[str] = ..., active_sessions: _Optional[int] = ..., free_sessions: _Optional[int] = ..., queue_depth: _Optional[int] = ..., kv_used_fraction: _Optional[float] = ..., peers: _Optional[_Iterable[_Union[PeerLatency, _Mapping]]] = ..., memory_used_bytes: _Optional[int] = ..., memory_budget_bytes: _Optional[int] = ..., prefix_tips: _Optional[_Iterable[_Union[PrefixTip, _Mapping]]] = ..., prefix_reported: _Optional[bool] = ..., prefix_bytes: _Optional[int] = ..., prefix_budget_bytes: _Optional[int] = ..., prefix_hits: _Optional[int] = ..., prefix_misses: _Optional[int] = ...) -> None: ...

class PrefixTip(_message.Message):
    __slots__ = ("link", "blocks")
    LINK_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    link: bytes
    blocks: int
    def __init__(self, link: _Optional[bytes] = ..., blocks: _Optional[int] = ...) -> None: ...

class PeerLatency(_message.Message):
    __slots__ = ("address", "rtt_ms")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    address: str
    rtt_ms: float
    def __init__(self, address: _Optional[str] = ..., rtt_ms: _Optional[float] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("known", "epoch", "probe")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    known: bool
    epoch: int
    probe: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, known: _Optional[bool] = ..., epoch: _Optional[int] = ..., probe: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchRevocationsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RevocationList(_message.Message):
    __slots__ = ("revoked_node_ids",)
    REVOKED_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    revoked_node_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, revoked_node_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RouteRequest(_message.Message):
    __slots__ = ("model", "session_id", "exclude_node_ids", "request_id", "ticket_seconds", "unbilled", "prefix_chain")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TICKET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UNBILLED_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CHAIN_FIELD_NUMBER: _ClassVar[int]
    model: str
    session_id: str
    exclude_node_ids: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    ticket_seconds: int
    unbilled: bool
    prefix_chain: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, model: _Optional[str] = ..., session_id: _Optional[str] = ..., exclude_node_ids: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ..., ticket_seconds: _Optional[int] = ..., unbilled: _Optional[bool] = ..., prefix_chain: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RouteReply(_message.Message):
    __slots__ = ("hops", "epoch", "model", "quantization", "n_layers", "estimated_ms_per_token", "ticket")
    class Hop(_message.Message):
        __slots__ = ("node_id", "address", "layer_start", "layer_stop", "fingerprint", "capability")
        NODE_ID_FIELD_NUMBER: _ClassVar[int]
        ADDRESS_FIELD_NUMBER: _ClassVar[int]
        LAYER_START_FIELD_NUMBER: _ClassVar[int]
        LAYER_STOP_FIELD_NUMBER: _ClassVar[int]
        FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
        CAPABILITY_FIELD_NUMBER: _ClassVar[int]
        node_id: str
        address: str
        layer_start: int
        layer_stop: int
        fingerprint: str
        capability: _node_pb2.NodeCapability
        def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., layer_start: _Optional[int] = ..., layer_stop: _Optional[int] = ..., fingerprint: _Optional[str] = ..., capability: _Optional[_Union[_node_pb2.NodeCapability, _Mapping]] = ...) -> None: ...
    HOPS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    N_LAYERS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_MS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    hops: _containers.RepeatedCompositeFieldContainer[RouteReply.Hop]
    epoch: int
    model: str
    quantization: str
    n_layers: int
    estimated_ms_per_token: float
    ticket: _ticket_pb2.RouteTicket
    def __init__(self, hops: _Optional[_Iterable[_Union[RouteReply.Hop, _Mapping]]] = ..., epoch: _Optional[int] = ..., model: _Optional[str] = ..., quantization: _Optional[str] = ..., n_layers: _Optional[int] = ..., estimated_ms_per_token: _Optional[float] = ..., ticket: _Optional[_Union[_ticket_pb2.RouteTicket, _Mapping]] = ...) -> None: ...

class WorkRecord(_message.Message):
    __slots__ = ("request_id", "session_id", "model", "status", "tokens_in", "tokens_out", "attribution", "billing_units", "started_at_unix_s", "finished_at_unix_s")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[WorkRecord.Status]
        STATUS_COMPLETED: _ClassVar[WorkRecord.Status]
        STATUS_CANCELLED: _ClassVar[WorkRecord.Status]
        STATUS_FAILED: _ClassVar[WorkRecord.Status]
        STATUS_UNVERIFIED: _ClassVar[WorkRecord.Status]
    STATUS_UNSPECIFIED: WorkRecord.Status
    STATUS_COMPLETED: WorkRecord.Status
    STATUS_CANCELLED: WorkRecord.Status
    STATUS_FAILED: WorkRecord.Status
    STATUS_UNVERIFIED: WorkRecord.Status
    class NodeShare(_message.Message):
        __slots__ = ("node_id", "layer_start", "layer_stop", "tokens")
        NODE_ID_FIELD_NUMBER: _ClassVar[int]
        LAYER_START_FIELD_NUMBER: _ClassVar[int]
        LAYER_STOP_FIELD_NUMBER: _ClassVar[int]
        TOKENS_FIELD_NUMBER: _ClassVar[int]
        node_id: str
        layer_start: int
        layer_stop: int
        tokens: int
        def __init__(self, node_id: _Optional[str] = ..., layer_start: _Optional[int] = ..., layer_stop: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_IN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_OUT_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    BILLING_UNITS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    session_id: str
    model: str
    status: WorkRecord.Status
    tokens_in: int
    tokens_out: int
    attribution: _containers.RepeatedCompositeFieldContainer[WorkRecord.NodeShare]
    billing_units: float
    started_at_unix_s: float
    finished_at_unix_s: float
    def __init__(self, request_id: _Optional[str] = ..., session_id: _Optional[str] = ..., model: _Optional[str] = ..., status: _Optional[_Union[WorkRecord.Status, str]] = ..., tokens_in: _Optional[int] = ..., tokens_out: _Optional[int] = ..., attribution: _Optional[_Iterable[_Union[WorkRecord.NodeShare, _Mapping]]] = ..., billing_units: _Optional[float] = ..., started_at_unix_s: _Optional[float] = ..., finished_at_unix_s: _Optional[float] = ...) -> None: ...

class SessionTokensReport(_message.Message):
    __slots__ = ("node_id", "sessions")
    class Session(_message.Message):
        __slots__ = ("session_id", "route_epoch", "positions", "prompt_tokens")
        SESSION_ID_FIELD_NUMBER: _ClassVar[int]
        ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
        POSITIONS_FIELD_NUMBER: _ClassVar[int]
        PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
        session_id: str
        route_epoch: int
        positions: int
        prompt_tokens: int
        def __init__(self, session_id: _Optional[str] = ..., route_epoch: _Optional[int] = ..., positions: _Optional[int] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    sessions: _containers.RepeatedCompositeFieldContainer[SessionTokensReport.Session]
    def __init__(self, node_id: _Optional[str] = ..., sessions: _Optional[_Iterable[_Union[SessionTokensReport.Session, _Mapping]]] = ...) -> None: ...

class SessionTokensAck(_message.Message):
    __slots__ = ("counted",)
    COUNTED_FIELD_NUMBER: _ClassVar[int]
    counted: int
    def __init__(self, counted: _Optional[int] = ...) -> None: ...

class RouteTiming(_message.Message):
    __slots__ = ("node_ids", "decode_ms_per_token", "tokens")
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    decode_ms_per_token: float
    tokens: int
    def __init__(self, node_ids: _Optional[_Iterable[str]] = ..., decode_ms_per_token: _Optional[float] = ..., tokens: _Optional[int] = ...) -> None: ...

class RouteTimingAck(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class WorkAck(_message.Message):
    __slots__ = ("request_id", "duplicate")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    duplicate: bool
    def __init__(self, request_id: _Optional[str] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelList(_message.Message):
    __slots__ = ("models", "epoch")
    class Model(_message.Message):
        __slots__ = ("name", "fingerprint", "quantization", "n_layers", "nodes", "routable", "head_sessions")
        NAME_FIELD_NUMBER: _ClassVar[int]
        FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
        QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
        N_LAYERS_FIELD_NUMBER: _ClassVar[int]
        NODES_FIELD_NUMBER: _ClassVar[int]
        ROUTABLE_FIELD_NUMBER: _ClassVar[int]
        HEAD_SESSIONS_FIELD_NUMBER: _ClassVar[int]
        name: str
        fingerprint: str
        quantization: str
        n_layers: int
        nodes: int
        routable: bool
        head_sessions: int
        def __init__(self, name: _Optional[str] = ..., fingerprint: _Optional[str] = ..., quantization: _Optional[str] = ..., n_layers: _Optional[int] = ..., nodes: _Optional[int] = ..., routable: _Optional[bool] = ..., head_sessions: _Optional[int] = ...) -> None: ...
    MODELS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelList.Model]
    epoch: int
    def __init__(self, models: _Optional[_Iterable[_Union[ModelList.Model, _Mapping]]] = ..., epoch: _Optional[int] = ...) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class DeregisterReply(_message.Message):
    __slots__ = ("known", "epoch")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    known: bool
    epoch: int
    def __init__(self, known: _Optional[bool] = ..., epoch: _Optional[int] = ...) -> None: ...

class QuarantineRequest(_message.Message):
    __slots__ = ("node_id", "reason", "request_id", "clear", "evidence")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    reason: str
    request_id: str
    clear: bool
    evidence: QuarantineEvidence
    def __init__(self, node_id: _Optional[str] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ..., clear: _Optional[bool] = ..., evidence: _Optional[_Union[QuarantineEvidence, _Mapping]] = ...) -> None: ...

class ListQuarantineRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QuarantinedNode(_message.Message):
    __slots__ = ("node_id", "reason", "request_id", "since_unix_s", "evidence")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    reason: str
    request_id: str
    since_unix_s: float
    evidence: QuarantineEvidence
    def __init__(self, node_id: _Optional[str] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ..., since_unix_s: _Optional[float] = ..., evidence: _Optional[_Union[QuarantineEvidence, _Mapping]] = ...) -> None: ...

class QuarantineList(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[QuarantinedNode]
    def __init__(self, nodes: _Optional[_Iterable[_Union[QuarantinedNode, _Mapping]]] = ...) -> None: ...

class QuarantineEvidence(_message.Message):
    __slots__ = ("rule", "audits")
    RULE_FIELD_NUMBER: _ClassVar[int]
    AUDITS_FIELD_NUMBER: _ClassVar[int]
    rule: str
    audits: _containers.RepeatedCompositeFieldContainer[AuditedRequest]
    def __init__(self, rule: _Optional[str] = ..., audits: _Optional[_Iterable[_Union[AuditedRequest, _Mapping]]] = ...) -> None: ...

class AuditedRequest(_message.Message):
    __slots__ = ("request_id", "runs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    runs: _containers.RepeatedCompositeFieldContainer[AuditRun]
    def __init__(self, request_id: _Optional[str] = ..., runs: _Optional[_Iterable[_Union[AuditRun, _Mapping]]] = ...) -> None: ...

class AuditRun(_message.Message):
    __slots__ = ("nodes", "output")
    NODES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    output: str
    def __init__(self, nodes: _Optional[_Iterable[str]] = ..., output: _Optional[str] = ...) -> None: ...

class QuarantineReply(_message.Message):
    __slots__ = ("known", "record_marked", "epoch")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    RECORD_MARKED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    known: bool
    record_marked: bool
    epoch: int
    def __init__(self, known: _Optional[bool] = ..., record_marked: _Optional[bool] = ..., epoch: _Optional[int] = ...) -> None: ...

class LayerSuggestionRequest(_message.Message):
    __slots__ = ("model", "block_bytes", "kv_bytes_per_layer", "head_bytes", "tail_bytes", "fixed_bytes", "budget_bytes", "tied_bytes")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_LAYER_FIELD_NUMBER: _ClassVar[int]
    HEAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    TAIL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FIXED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIED_BYTES_FIELD_NUMBER: _ClassVar[int]
    model: str
    block_bytes: _containers.RepeatedScalarFieldContainer[int]
    kv_bytes_per_layer: int
    head_bytes: int
    tail_bytes: int
    fixed_bytes: int
    budget_bytes: int
    tied_bytes: int
    def __init__(self, model: _Optional[str] = ..., block_bytes: _Optional[_Iterable[int]] = ..., kv_bytes_per_layer: _Optional[int] = ..., head_bytes: _Optional[int] = ..., tail_bytes: _Optional[int] = ..., fixed_bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., tied_bytes: _Optional[int] = ...) -> None: ...

class LayerSuggestionReply(_message.Message):
    __slots__ = ("layer_start", "layer_stop", "reason")
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_STOP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    layer_start: int
    layer_stop: int
    reason: str
    def __init__(self, layer_start: _Optional[int] = ..., layer_stop: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...
