from meshnet.wire.generated import node_pb2 as _node_pb2
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
        __slots__ = ("node_id", "record", "memory_used_bytes", "memory_budget_bytes", "active_sessions", "free_sessions", "queue_depth", "kv_used_fraction", "seconds_since_heartbeat", "routed_decode_tokens_per_s", "speed_measured", "prefix_reported", "prefix_bytes", "prefix_budget_bytes", "prefix_hits", "prefix_misses", "reachability")
        NODE_ID_FIELD_NUMBER: _ClassVar[int]
        RECORD_FIELD_NUMBER: _ClassVar[int]
        MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
        MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
        ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
        FREE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
        QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
        KV_USED_FRACTION_FIELD_NUMBER: _ClassVar[int]
        SECONDS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
        ROUTED_DECODE_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
        SPEED_MEASURED_FIELD_NUMBER: _ClassVar[int]
        PREFIX_REPORTED_FIELD_NUMBER: _ClassVar[int]
        PREFIX_BYTES_FIELD_NUMBER: _ClassVar[int]
        PREFIX_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
        PREFIX_HITS_FIELD_NUMBER: _ClassVar[int]
        PREFIX_MISSES_FIELD_NUMBER: _ClassVar[int]
        REACHABILITY_FIELD_NUMBER: _ClassVar[int]
        node_id: str
        record: _node_pb2.NodeRecord
        memory_used_bytes: int
        memory_budget_bytes: int
        active_sessions: int
        free_sessions: int
        queue_depth: int
        kv_used_fraction: float
        seconds_since_heartbeat: float
        routed_decode_tokens_per_s: float
        speed_measured: bool
        prefix_reported: bool
        prefix_bytes: int
        prefix_budget_bytes: int
        prefix_hits: int
        prefix_misses: int
        reachability: str
        def __init__(self, node_id: _Optional[str] = ..., record: _Optional[_Union[_node_pb2.NodeRecord, _Mapping]] = ..., memory_used_bytes: _Optional[int] = ..., memory_budget_bytes: _Optional[int] = ..., active_sessions: _Optional[int] = ..., free_sessions: _Optional[int] = ..., queue_depth: _Optional[int] = ..., kv_used_fraction: _Optional[float] = ..., seconds_since_heartbeat: _Optional[float] = ..., routed_decode_tokens_per_s: _Optional[float] = ..., speed_measured: _Optional[bool] = ..., prefix_reported: _Optional[bool] = ..., prefix_bytes: _Optional[int] = ..., prefix_budget_bytes: _Optional[int] = ..., prefix_hits: _Optional[int] = ..., prefix_misses: _Optional[int] = ..., reachability: _Optional[str] = ...) -> None: ...
    NODES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatusList.Node]
    epoch: int
    heartbeat_interval_s: float
    expire_after_s: float
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatusList.Node, _Mapping]]] = ..., epoch: _Optional[int] = ..., heartbeat_interval_s: _Optional[float] = ..., expire_after_s: _Optional[float] = ...) -> None: ...
