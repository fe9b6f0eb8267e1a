"""The gRPC services of shard.proto and tracker.proto, for the servers and clients outside ``protocol``.

Generated code is imported only inside ``meshnet.protocol`` (an import-linter contract keeps it
so): servers register their servicers and clients open stubs through the names here, and they
read and build messages only through ``shard_wire`` and ``tracker_wire``. The message classes
below are re-exported for the servicers' method signatures; use them qualified
(``services.NodeRegistration``), since several share a name with the core value they carry.
"""

from __future__ import annotations

from meshnet.protocol.generated import shard_pb2_grpc, tracker_pb2_grpc
from meshnet.protocol.generated.shard_pb2 import (
    CancelRequest,
    CancelResponse,
    Capability,
    CapabilityRequest,
    MetricsRequest,
    MetricsSnapshot,
    ReleaseRequest,
    ReleaseResponse,
    StepRequest,
    StepResponse,
)
from meshnet.protocol.generated.tracker_pb2 import (
    DeregisterReply,
    DeregisterRequest,
    HeartbeatReply,
    LayerSuggestionReply,
    LayerSuggestionRequest,
    ListModelsRequest,
    ModelList,
    NodeHeartbeat,
    NodeRegistration,
    RegisterReply,
    RouteReply,
    RouteRequest,
    WorkAck,
    WorkRecord,
)

SHARD_SERVICE = "meshnet.v1.Shard"
TRACKER_SERVICE = "meshnet.v1.Tracker"
"""Full service names, as health checks and retry policies name them."""

ShardServicer = shard_pb2_grpc.ShardServicer
ShardStub = shard_pb2_grpc.ShardStub
add_shard_servicer = shard_pb2_grpc.add_ShardServicer_to_server

TrackerServicer = tracker_pb2_grpc.TrackerServicer
TrackerStub = tracker_pb2_grpc.TrackerStub
add_tracker_servicer = tracker_pb2_grpc.add_TrackerServicer_to_server

__all__ = [
    "SHARD_SERVICE",
    "TRACKER_SERVICE",
    "CancelRequest",
    "CancelResponse",
    "Capability",
    "CapabilityRequest",
    "DeregisterReply",
    "DeregisterRequest",
    "HeartbeatReply",
    "LayerSuggestionReply",
    "LayerSuggestionRequest",
    "ListModelsRequest",
    "MetricsRequest",
    "MetricsSnapshot",
    "ModelList",
    "NodeHeartbeat",
    "NodeRegistration",
    "RegisterReply",
    "ReleaseRequest",
    "ReleaseResponse",
    "RouteReply",
    "RouteRequest",
    "ShardServicer",
    "ShardStub",
    "StepRequest",
    "StepResponse",
    "TrackerServicer",
    "TrackerStub",
    "WorkAck",
    "WorkRecord",
    "add_shard_servicer",
    "add_tracker_servicer",
]
