"""The tracker's ArtifactDirectory servicer: holders announce, fetchers ask who holds what.

Thin over ``artifact.directory.HolderDirectory``; it runs in the tracker process beside the
Tracker service, on the same port. Holders are forgotten ``missed`` announcement intervals
after their last one, like nodes after missed heartbeats.
"""

from __future__ import annotations

import grpc
import grpc.aio

from meshnet.artifact.directory import Clock, HolderDirectory
from meshnet.core.errors import MeshnetError
from meshnet.tracker.call_guards import admit_call
from meshnet.wire import artifact_wire as wire
from meshnet.wire import services
from meshnet.wire.status import abort_with
from meshnet.wire.tls import LinkSecurity


class ArtifactDirectoryServicer(services.ArtifactDirectoryServicer):
    def __init__(self, clock: Clock, interval_s: float, missed: int, security: LinkSecurity | None = None) -> None:
        self.interval_s = interval_s
        self.directory = HolderDirectory(clock, ttl_s=interval_s * missed)
        self._security = security
        """None only on a plaintext loopback tracker; otherwise holders speak for themselves only."""

    async def Advertise(
        self, request: services.ArtifactAdvertisement, context: grpc.aio.ServicerContext
    ) -> services.ArtifactAdvertisementAck:
        try:
            advertisement = wire.advertisement_from_proto(request)
            admit_call(self._security, context, "Advertise", advertisement.holder_id)
            self.directory.advertise(advertisement)
        except MeshnetError as error:
            await abort_with(context, error)
        return wire.advertisement_ack_to_proto(self.directory.ttl_s, self.interval_s)

    async def FindHolders(
        self, request: services.FindHoldersRequest, context: grpc.aio.ServicerContext
    ) -> services.FindHoldersReply:
        try:
            admit_call(self._security, context, "FindHolders")
            model_id, artifacts = wire.find_from_proto(request)
        except MeshnetError as error:
            await abort_with(context, error)
        return wire.found_to_proto(self.directory.find(model_id, artifacts))


def add_artifact_directory(
    server: grpc.aio.Server, clock: Clock, interval_s: float, missed: int, security: LinkSecurity | None = None
) -> None:
    """Serve the holder directory on the tracker's ``server``."""
    servicer = ArtifactDirectoryServicer(clock, interval_s, missed, security)
    services.add_artifact_directory_servicer(servicer, server)
