"""Serving artifacts: the Artifacts servicer over a node's holdings, and the seeder process.

The servicer is thin: decode the range, read it from ``Holdings``, stream bounded chunks with
their CRC-32. A seeder (``meshnet seed DIR``) is this servicer over a published directory plus
an announcer that tells the tracker what it holds. With a swarm identity the server requires a
client certificate and serves only the roles ``authorize_artifacts`` allows, and a holder
announces itself under its certificate's node id (the directory checks that binding).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio

from meshnet.artifact.directory import Advertisement, HeldManifest
from meshnet.artifact.holdings import Holdings, published_holdings, range_holdings
from meshnet.core.addresses import dialable_address, parse_address_list
from meshnet.core.config_flags import cli
from meshnet.core.errors import FailedPrecondition, InvalidArgument, MeshnetError
from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.fetch.fetcher import FetchConfig, FetchedRange, fetch_range
from meshnet.fetch.holders import artifact_channel_options
from meshnet.membership.announce import announce_forever
from meshnet.membership.join import own_node_id
from meshnet.membership.tracker_client import TrackerClient
from meshnet.membership.upkeep import upkeep_tasks
from meshnet.node.config import WorkerConfig
from meshnet.security.policy import authorize_artifacts
from meshnet.wire import artifact_wire as wire
from meshnet.wire import services
from meshnet.wire.status import abort_with
from meshnet.wire.tls import LinkSecurity, bind, enforce

logger = logging.getLogger(__name__)


class ArtifactsServicer(services.ArtifactsServicer):
    def __init__(self, holdings: Holdings, security: LinkSecurity | None = None) -> None:
        self.holdings = holdings
        self._security = security
        """None only on a plaintext loopback node: then nobody is checked."""

    def admit(self, context: grpc.aio.ServicerContext) -> None:
        if self._security is not None:
            peer = self._security.peer(context)
            enforce(authorize_artifacts(peer, "Fetch", revoked=self._security.revocations.current()))

    async def Fetch(
        self, request: services.ArtifactFetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[services.ArtifactChunk]:
        try:
            self.admit(context)
            wanted = wire.fetch_from_proto(request)
            size = self.holdings.size(wanted.artifact)
            end = size if wanted.length == 0 else wanted.offset + wanted.length
            if wanted.offset > size or end > size:
                raise InvalidArgument(f"range {wanted.offset}+{wanted.length} lies outside the {size}-byte artifact")
            offset = wanted.offset
            while offset < end:
                length = min(wanted.chunk_bytes, end - offset)
                data = await asyncio.to_thread(self.holdings.read, wanted.artifact, offset, length)
                yield wire.chunk_to_proto(offset, data)
                offset += length
        except MeshnetError as error:
            await abort_with(context, error)
        except OSError as error:
            await abort_with(context, FailedPrecondition(f"cannot read the artifact: {error.strerror or error}"))


def artifact_server(host: str, port: int, security: LinkSecurity | None = None) -> tuple[grpc.aio.Server, int]:
    """A server bound to ``host:port`` (exclusively; port 0 picks one; mTLS when secured), not yet started."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *artifact_channel_options()])
    try:
        return server, bind(server, f"{host}:{port}", security)
    except RuntimeError as error:
        raise FailedPrecondition(f"cannot listen on {host}:{port} (is the port in use?): {error}") from error


def advertisement_of(holdings: Holdings, holder_id: str, address: str) -> Advertisement:
    manifests = {digest for _, digest in holdings.manifests}
    return Advertisement(
        holder_id,
        address,
        frozenset(d for d in holdings.artifacts if d not in manifests),
        tuple(HeldManifest(model_id, digest) for model_id, digest in holdings.manifests),
    )


async def fetch_worker_range(config: WorkerConfig, security: LinkSecurity | None = None) -> FetchedRange:
    """Fetch a worker's range by model id (``--model-id``), showing progress in the log."""
    if config.model_id is None or config.tracker is None:
        raise InvalidArgument("fetching a range needs --model-id and --tracker")
    fetch = FetchConfig(config.model_id, config.layers, config.tracker, config.data_dir, config.trust_publisher)
    fetched = await fetch_range(fetch, security=security)
    logger.info(
        "fetched layers %s of %s: %d bytes for %d bytes of artifacts in %.1f s",
        config.layers, config.model_id, fetched.fetched_bytes, fetched.needed_bytes, fetched.seconds,
    )  # fmt: skip
    return fetched


def serve_fetched_artifacts(
    fetched: FetchedRange,
    layers: LayerRange,
    address: str,
    node_id: NodeId,
    server: grpc.aio.Server,
    security: LinkSecurity | None = None,
) -> Advertisement:
    """Serve the artifacts inside a fetched range's slice on ``server``; what to announce (as
    ``node_id``, the worker's one id)."""
    files = fetched.files
    holdings = range_holdings(fetched.manifest_path, fetched.header, files.slice, files.embeddings, layers)
    services.add_artifacts_servicer(ArtifactsServicer(holdings, security), server)
    return advertisement_of(holdings, node_id, address)


@dataclass(frozen=True)
class SeedConfig:
    directory: Path = field(metadata=cli(positional=True))
    """Published directory (manifest.json and artifacts/) to serve."""
    tracker: str | None = None
    """Tracker (host:port, or its replicas: a:7070,b:7070) to announce the held
    artifacts to; none serves without announcing."""
    host: str = "127.0.0.1"
    """Bind address: loopback unless told otherwise."""
    port: int = 0
    """Port to listen on; 0 picks a free one (printed on start)."""
    advertise: str | None = None
    """Address (host:port) fetchers dial; none uses host:port as bound."""

    def __post_init__(self) -> None:
        if self.tracker is not None:  # before --join spends a one-use invite
            parse_address_list(self.tracker)


async def serve_seeder(
    config: SeedConfig,
    stop: asyncio.Event,
    on_ready: Callable[[str, Holdings], None] | None = None,
    security: LinkSecurity | None = None,
) -> None:
    """Serve ``config.directory`` until ``stop`` is set, announcing it to the tracker.

    ``security``: the seeder's swarm identity (a worker-role certificate); None is plaintext.
    Secured, with a tracker, it renews its certificate and refuses revoked peers like every
    member (``membership.upkeep``)."""
    holdings = await asyncio.to_thread(published_holdings, config.directory)
    server, port = artifact_server(config.host, config.port, security)
    services.add_artifacts_servicer(ArtifactsServicer(holdings, security), server)
    await server.start()
    address = config.advertise or dialable_address(f"{config.host}:{port}", toward=config.tracker)
    # One id for the seeder: its certificate's when secured (the directory insists); it also
    # picks the seeder's tracker replica, as a worker's does.
    node_id = own_node_id(security)
    tracker = None if config.tracker is None else TrackerClient(config.tracker, security=security, replica_key=node_id)
    tasks: list[asyncio.Task[None]] = []
    if tracker is not None:
        advertisement = advertisement_of(holdings, node_id, address)
        tasks = [
            asyncio.create_task(announce_forever(tracker, advertisement, stop)),
            *upkeep_tasks(tracker, security, stop),
        ]
    if on_ready is not None:
        on_ready(address, holdings)
    try:
        await stop.wait()
    finally:
        await asyncio.gather(*tasks, return_exceptions=True)
        if tracker is not None:
            await tracker.close()
        await server.stop(1.0)
