from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatusList(_message.Message):
    __slots__ = ("nodes", "epoch", "heartbeat_interval_s", "expire_after_s")
    class Node(_message.Message):
        __slots__ = ("node_id", "address", "model", "fingerprint", "quantization", "layer_start", "layer_stop", "n_layers", "cpu_count", "memory_bytes", "memory_used_bytes", "memory_budget_bytes", "max_sessions", "active_sessions", "free_sessions", "queue_depth", "kv_used_fraction", "prefill_tokens_per_s", "decode_tokens_per_s", "seconds_since_heartbeat", "certified")
        NODE_ID_FIELD_NUMBER: _ClassVar[int]
        ADDRESS_FIELD_NUMBER: _ClassVar[int]
        MODEL_FIELD_NUMBER: _ClassVar[int]
        FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
        QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
        LAYER_START_FIELD_NUMBER: _ClassVar[int]
        LAYER_STOP_FIELD_NUMBER: _ClassVar[int]
        N_LAYERS_FIELD_NUMBER: _ClassVar[int]
        CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
        MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
        MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
        MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
        MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
        ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
        FREE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
        QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
        KV_USED_FRACTION_FIELD_NUMBER: _ClassVar[int]
        PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
        DECODE_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
        SECONDS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
        CERTIFIED_FIELD_NUMBER: _ClassVar[int]
        node_id: str
        address: str
        model: str
        fingerprint: str
        quantization: str
        layer_start: int
        layer_stop: int
        n_layers: int
        cpu_count: int
        memory_bytes: int
        memory_used_bytes: int
        memory_budget_bytes: int
        max_sessions: int
        active_sessions: int
        free_sessions: int
        queue_depth: int
        kv_used_fraction: float
        prefill_tokens_per_s: float
        decode_tokens_per_s: float
        seconds_since_heartbeat: float
        certified: bool
        def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., model: _Optional[str] = ..., fingerprint: _Optional[str] = ..., quantization: _Optional[str] = ..., layer_start: _Optional[int] = ..., layer_stop: _Optional[int] = ..., n_layers: _Optional[int] = ..., cpu_count: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., memory_budget_bytes: _Optional[int] = ..., max_sessions: _Optional[int] = ..., active_sessions: _Optional[int] = ..., free_sessions: _Optional[int] = ..., queue_depth: _Optional[int] = ..., kv_used_fraction: _Optional[float] = ..., prefill_tokens_per_s: _Optional[float] = ..., decode_tokens_per_s: _Optional[float] = ..., seconds_since_heartbeat: _Optional[float] = ..., certified: _Optional[bool] = ...) -> None: ...
    NODES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatusList.Node]
    epoch: int
    heartbeat_interval_s: float
    expire_after_s: float
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatusList.Node, _Mapping]]] = ..., epoch: _Optional[int] = ..., heartbeat_interval_s: _Optional[float] = ..., expire_after_s: _Optional[float] = ...) -> None: ...
