"""An experiment: what one heartbeat costs the tracker as a unary call vs on a long-lived stream.

Not a service of meshnet: a throwaway echo server beside the real tracker, to decide whether
streaming heartbeats (issue 36, item 4) are worth building. Both transports carry the real
messages (``NodeHeartbeat`` in, ``HeartbeatReply`` out), parsed and built by the tracker's own
conversions, over mTLS with the tracker's certificate; a unary call reads the caller's
certificate on every call, as the tracker's servicer does, a stream once when it opens. The
registry's work is left out on purpose: it is the same for both, and what differs is the call.

``serve`` runs the server (its own process, pinned by the bench); ``measure`` drives N nodes,
each with its own channel, heartbeating every interval, and reads the server's CPU with psutil.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
import psutil

from meshnet.core.ids import NodeId, new_node_id
from meshnet.core.tracking import HeartbeatStatus, NodeLoad
from meshnet.membership.load_figures import Histogram, ProcessMeter, bucket, percentile
from meshnet.membership.simulated_nodes import tracker_channel
from meshnet.security.certificates import mint_node
from meshnet.security.swarm_dir import load_authority, tracker_identity
from meshnet.wire import services
from meshnet.wire.tls import LinkSecurity
from meshnet.wire.tracker_wire import heartbeat_from_proto, heartbeat_status_to_proto, heartbeat_to_proto

SERVICE = "meshnet.experiment.HeartbeatEcho"
READY_PREFIX = "heartbeat transport listening on"
Transport = Literal["unary", "stream"]
CONNECT_TIMEOUT_S = 120.0
"""Every node's handshake and first heartbeat, before the span starts."""
_REPLY = heartbeat_status_to_proto(HeartbeatStatus(known=True, epoch=1))


def _handlers(security: LinkSecurity) -> grpc.GenericRpcHandler:
    async def unary(request: services.NodeHeartbeat, context: grpc.aio.ServicerContext) -> services.HeartbeatReply:
        security.peer(context)
        heartbeat_from_proto(request)
        return _REPLY

    async def stream(
        requests: AsyncIterator[services.NodeHeartbeat], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[services.HeartbeatReply]:
        security.peer(context)
        async for request in requests:
            heartbeat_from_proto(request)
            yield _REPLY

    decode, encode = services.NodeHeartbeat.FromString, services.HeartbeatReply.SerializeToString
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary, decode, encode),
            "Stream": grpc.stream_stream_rpc_method_handler(stream, decode, encode),
        },
    )


async def serve(data_dir: Path) -> None:
    security = LinkSecurity(tracker_identity(data_dir))
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_handlers(security),))
    port = server.add_secure_port("127.0.0.1:0", security.server_credentials())
    await server.start()
    print(f"{READY_PREFIX} 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


@dataclass(frozen=True)
class TransportSpec:
    address: str
    data_dir: Path
    transport: Transport
    nodes: int
    interval_s: float
    seconds: float
    server_pid: int


class _Start:
    """Every node connects (TLS handshake, stream opened) and sends one heartbeat before the
    measured span starts: the span holds heartbeats only, not the cost of connecting."""

    def __init__(self, nodes: int) -> None:
        self._waiting = nodes
        self.connected = asyncio.Event()
        self.go = asyncio.Event()

    def one_connected(self) -> None:
        self._waiting -= 1
        if self._waiting == 0:
            self.connected.set()


async def _node(spec: TransportSpec, security: LinkSecurity, phase: float, start: _Start, latencies: Histogram) -> None:
    channel = tracker_channel(spec.address, security)
    peers = tuple((f"10.0.0.{i}:7000", 1.5) for i in range(12))
    message = heartbeat_to_proto(NodeId(security.identity.node_id), NodeLoad(free_sessions=7, peer_rtt_ms=peers))
    decode, encode = services.HeartbeatReply.FromString, services.NodeHeartbeat.SerializeToString
    unary = channel.unary_unary(f"/{SERVICE}/Unary", request_serializer=encode, response_deserializer=decode)
    stream = channel.stream_stream(f"/{SERVICE}/Stream", request_serializer=encode, response_deserializer=decode)
    call = stream() if spec.transport == "stream" else None

    async def beat() -> None:
        if call is None:
            await unary(message, timeout=spec.interval_s)
        else:
            await call.write(message)
            await call.read()

    try:
        await beat()
        start.one_connected()
        await start.go.wait()
        due = time.monotonic() + phase * spec.interval_s
        end = time.monotonic() + spec.seconds
        while due < end:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            started = time.perf_counter()
            await beat()
            latencies[bucket((time.perf_counter() - started) * 1000.0)] += 1
            due += spec.interval_s
    finally:
        if call is not None:
            await call.done_writing()
        await channel.close()


async def measure(spec: TransportSpec) -> dict[str, Any]:
    """Heartbeats of ``spec.nodes`` connected nodes for ``spec.seconds``: the server's CPU per heartbeat."""
    authority, now = load_authority(spec.data_dir), time.time()
    securities = [
        LinkSecurity(mint_node(authority, node_id=new_node_id("worker"), role="worker", now_unix_s=now))
        for _ in range(spec.nodes)
    ]
    latencies: Histogram = Counter()
    start = _Start(spec.nodes)
    nodes = asyncio.gather(
        *(_node(spec, security, index / spec.nodes, start, latencies) for index, security in enumerate(securities))
    )
    await asyncio.wait_for(start.connected.wait(), CONNECT_TIMEOUT_S)
    server, client = ProcessMeter(spec.server_pid), ProcessMeter(psutil.Process().pid)
    began = time.monotonic()
    start.go.set()
    await nodes
    server_cores, client_cores = server.cores() or 0.0, client.cores() or 0.0
    per_s = sum(latencies.values()) / (time.monotonic() - began)
    return {
        "transport": spec.transport,
        "nodes": spec.nodes,
        "interval_s": spec.interval_s,
        "heartbeats_per_s": round(per_s, 1),
        "server_cores": server_cores,
        "server_us_per_heartbeat": round(server_cores / per_s * 1e6, 1) if per_s else None,
        "client_us_per_heartbeat": round(client_cores / per_s * 1e6, 1) if per_s else None,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
    }


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "serve":
        asyncio.run(serve(Path(argv[1])))
        return 0
    if len(argv) == 2 and argv[0] == "measure":
        document = json.loads(Path(argv[1]).read_text())
        spec = TransportSpec(**{**document, "data_dir": Path(document["data_dir"])})
        print(json.dumps(asyncio.run(measure(spec))), flush=True)
        return 0
    print("usage: python -m meshnet.membership.heartbeat_transport serve DATA_DIR | measure SPEC.json", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
