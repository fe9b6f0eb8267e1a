"""The gRPC services of shard.proto and tracker.proto, for the servers and clients outside ``protocol``.

Generated code is imported only inside ``meshnet.wire`` (an import-linter contract keeps it
so): servers register their servicers and clients open stubs through the names here, and they
read and build messages only through ``shard_wire`` and ``tracker_wire``. The message classes
below are re-exported for the servicers' method signatures; use them qualified
(``services.NodeRegistration``), since several share a name with the core value they carry.
"""

from __future__ import annotations

from meshnet.wire.generated import (
    artifact_pb2_grpc,
    shard_pb2_grpc,
    swarm_pb2_grpc,
    swarm_status_pb2_grpc,
    tracker_pb2_grpc,
)
from meshnet.wire.generated.artifact_pb2 import (
    ArtifactAdvertisement,
    ArtifactAdvertisementAck,
    ArtifactChunk,
    ArtifactFetchRequest,
    FindHoldersReply,
    FindHoldersRequest,
)
from meshnet.wire.generated.shard_pb2 import (
    BatchAck,
    CancelRequest,
    CancelResponse,
    Capability,
    CapabilityRequest,
    HeldKvReply,
    HeldKvRequest,
    HeldSnapshotsReply,
    HeldSnapshotsRequest,
    MetricsRequest,
    MetricsSnapshot,
    ReleaseRequest,
    ReleaseResponse,
    RingOpen,
    RingSubscribe,
    SnapshotKept,
    SnapshotPiece,
    StepBatch,
    StepRequest,
    StepResponse,
    StepResponseBatch,
)
from meshnet.wire.generated.swarm_pb2 import (
    SwarmCertificateReply,
    SwarmJoinRequest,
    SwarmRenewRequest,
    SwarmRevokeReply,
    SwarmRevokeRequest,
)
from meshnet.wire.generated.swarm_status_pb2 import ListNodesRequest, NodeStatusList
from meshnet.wire.generated.tracker_pb2 import (
    DeregisterReply,
    DeregisterRequest,
    HeartbeatReply,
    LayerSuggestionReply,
    LayerSuggestionRequest,
    ListModelsRequest,
    ListQuarantineRequest,
    ModelList,
    NodeHeartbeat,
    NodeRegistration,
    QuarantineList,
    QuarantineReply,
    QuarantineRequest,
    RegisterReply,
    RevocationList,
    RouteReply,
    RouteRequest,
    RouteTiming,
    RouteTimingAck,
    SessionTokensAck,
    SessionTokensReport,
    WatchRevocationsRequest,
    WorkAck,
    WorkRecord,
)
from meshnet.wire.relay_wire import RELAY_SERVICE

ARTIFACTS_SERVICE = "meshnet.v1.Artifacts"
ARTIFACT_DIRECTORY_SERVICE = "meshnet.v1.ArtifactDirectory"
SHARD_SERVICE = "meshnet.v1.Shard"
TRACKER_SERVICE = "meshnet.v1.Tracker"
SWARM_SERVICE = "meshnet.v1.Swarm"
SWARM_STATUS_SERVICE = "meshnet.v1.SwarmStatus"
"""Full service names, as health checks and retry policies name them. The relay's service
(``RELAY_SERVICE``) is served and called through ``relay_wire``: its Dial and Splice carry
bytes the relay forwards without parsing, so they have no generated stub."""

ShardServicer = shard_pb2_grpc.ShardServicer
ShardStub = shard_pb2_grpc.ShardStub
add_shard_servicer = shard_pb2_grpc.add_ShardServicer_to_server

TrackerServicer = tracker_pb2_grpc.TrackerServicer
TrackerStub = tracker_pb2_grpc.TrackerStub
add_tracker_servicer = tracker_pb2_grpc.add_TrackerServicer_to_server

ArtifactsServicer = artifact_pb2_grpc.ArtifactsServicer
ArtifactsStub = artifact_pb2_grpc.ArtifactsStub
add_artifacts_servicer = artifact_pb2_grpc.add_ArtifactsServicer_to_server

ArtifactDirectoryServicer = artifact_pb2_grpc.ArtifactDirectoryServicer
ArtifactDirectoryStub = artifact_pb2_grpc.ArtifactDirectoryStub
add_artifact_directory_servicer = artifact_pb2_grpc.add_ArtifactDirectoryServicer_to_server

SwarmServicer = swarm_pb2_grpc.SwarmServicer
SwarmStub = swarm_pb2_grpc.SwarmStub
add_swarm_servicer = swarm_pb2_grpc.add_SwarmServicer_to_server
SwarmStatusServicer = swarm_status_pb2_grpc.SwarmStatusServicer
SwarmStatusStub = swarm_status_pb2_grpc.SwarmStatusStub
add_swarm_status_servicer = swarm_status_pb2_grpc.add_SwarmStatusServicer_to_server

__all__ = [
    "ARTIFACTS_SERVICE",
    "ARTIFACT_DIRECTORY_SERVICE",
    "RELAY_SERVICE",
    "SHARD_SERVICE",
    "SWARM_SERVICE",
    "SWARM_STATUS_SERVICE",
    "TRACKER_SERVICE",
    "ArtifactAdvertisement",
    "ArtifactAdvertisementAck",
    "ArtifactChunk",
    "ArtifactDirectoryServicer",
    "ArtifactDirectoryStub",
    "ArtifactFetchRequest",
    "ArtifactsServicer",
    "ArtifactsStub",
    "BatchAck",
    "CancelRequest",
    "CancelResponse",
    "Capability",
    "CapabilityRequest",
    "DeregisterReply",
    "DeregisterRequest",
    "FindHoldersReply",
    "FindHoldersRequest",
    "HeartbeatReply",
    "HeldKvReply",
    "HeldKvRequest",
    "HeldSnapshotsReply",
    "HeldSnapshotsRequest",
    "LayerSuggestionReply",
    "LayerSuggestionRequest",
    "ListModelsRequest",
    "ListNodesRequest",
    "ListQuarantineRequest",
    "MetricsRequest",
    "MetricsSnapshot",
    "ModelList",
    "NodeHeartbeat",
    "NodeRegistration",
    "NodeStatusList",
    "QuarantineList",
    "QuarantineReply",
    "QuarantineRequest",
    "RegisterReply",
    "ReleaseRequest",
    "ReleaseResponse",
    "RevocationList",
    "RingOpen",
    "RingSubscribe",
    "RouteReply",
    "RouteRequest",
    "RouteTiming",
    "RouteTimingAck",
    "SessionTokensAck",
    "SessionTokensReport",
    "ShardServicer",
    "ShardStub",
    "SnapshotKept",
    "SnapshotPiece",
    "StepBatch",
    "StepRequest",
    "StepResponse",
    "StepResponseBatch",
    "SwarmCertificateReply",
    "SwarmJoinRequest",
    "SwarmRenewRequest",
    "SwarmRevokeReply",
    "SwarmRevokeRequest",
    "SwarmServicer",
    "SwarmStatusServicer",
    "SwarmStatusStub",
    "SwarmStub",
    "TrackerServicer",
    "TrackerStub",
    "WatchRevocationsRequest",
    "WorkAck",
    "WorkRecord",
    "add_artifact_directory_servicer",
    "add_artifacts_servicer",
    "add_shard_servicer",
    "add_swarm_servicer",
    "add_swarm_status_servicer",
    "add_tracker_servicer",
]
