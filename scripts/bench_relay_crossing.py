"""The relay's processing per crossing, and what a relayed hop adds to a round trip, on loopback.

    python scripts/bench_relay_crossing.py --calls 2000 --out bench/results/relay-crossing.json

A secured swarm minted in a temporary folder; the relay runs in a child process of its own (the
real ``RelayServicer``, ``start_relay`` as ``meshnet relay`` runs it), a private node's mTLS
server (one unary method that answers what it got) is attached to it with
``meshnet.relay.attach``, and a dialer calls that server with ``--payload`` bytes (16 KiB: one
token's hidden state of an 8B model in f32), alternately direct and at ``NODE@RELAY`` through
``meshnet.relay.dial``. Two figures:

- ``relay_crossing_ms``: inside the relay, each message from its read returning to its write to
  the other side returning (the issue's budget: 0.5 ms per crossing), p50/p99 over every
  message of every call, both directions;
- ``direct_rtt_ms`` / ``relayed_rtt_ms``: the call's round trip each way; their p50 difference is
  what the whole relayed path adds (the dialer's forwarder, two relay crossings, the node's
  splice, one more TLS-over-gRPC hop each way) on one machine, where the link adds nothing.

Every process shares this machine's cores; the load average is recorded beside the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import grpc.aio

from meshnet.relay.attach import attach
from meshnet.relay.config import RelayConfig
from meshnet.relay.dial import dial
from meshnet.relay.serve import start_relay
from meshnet.security.swarm_dir import load_identity, local_identity
from meshnet.wire.tls import LinkSecurity, bind, hop_server_name

ECHO = "/meshnet.bench.Echo/Echo"


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "count": len(ordered),
    }


async def serve_relay_child(identity: Path, times_path: Path) -> None:
    """The child: a relay on 127.0.0.1:0 that prints its address and, on SIGTERM, writes its timings."""
    crossings: list[float] = []
    running = await start_relay(
        RelayConfig(listen="127.0.0.1:0"), LinkSecurity(load_identity(identity)), on_crossing=crossings.append
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(running.address, flush=True)
    await stop.wait()
    times_path.write_text(json.dumps(crossings))
    await running.stop(0)


async def echo_server(security: LinkSecurity) -> tuple[grpc.aio.Server, int]:
    async def echo(request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
        return request

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "meshnet.bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = bind(server, "127.0.0.1:0", security)
    await server.start()
    return server, port


async def timed_calls(channel: grpc.aio.Channel, payload: bytes, calls: int) -> list[float]:
    method = channel.unary_unary(ECHO)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        answer = await method(payload, timeout=10)
        times.append((time.perf_counter() - started) * 1000)
        if answer != payload:
            raise SystemExit("the echo answered other bytes")
    return times


async def measure(root: Path, relay: str, payload: bytes, calls: int) -> dict[str, object]:
    node = LinkSecurity(load_identity(local_identity(root, "node", "worker", time.time())))
    dialer = LinkSecurity(load_identity(local_identity(root, "dialer", "gateway", time.time())))
    server, port = await echo_server(node)
    addresses: list[str | None] = []
    attachment = asyncio.create_task(attach([relay], f"127.0.0.1:{port}", node, addresses.append))
    while not addresses or addresses[-1] is None:
        await asyncio.sleep(0.01)
    name = hop_server_name(node.identity.node_id)
    direct = dial(f"127.0.0.1:{port}", dialer, name, [])
    relayed = dial(str(addresses[-1]), dialer, name, [])
    await timed_calls(direct, payload, 50)  # handshakes and warm paths out of the figures
    await timed_calls(relayed, payload, 50)
    direct_ms: list[float] = []
    relayed_ms: list[float] = []
    for _ in range(10):  # interleaved: a load change on the shared machine hits both
        direct_ms += await timed_calls(direct, payload, calls // 10)
        relayed_ms += await timed_calls(relayed, payload, calls // 10)
    await direct.close()
    await relayed.close()
    attachment.cancel()
    await asyncio.gather(attachment, return_exceptions=True)
    await server.stop(0)
    return {"direct_rtt_ms": percentiles(direct_ms), "relayed_rtt_ms": percentiles(relayed_ms)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--payload", type=int, default=16 * 1024)
    parser.add_argument("--out", type=Path, default=Path("bench/results/relay-crossing.json"))
    parser.add_argument("--relay-child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.relay_child:
        asyncio.run(serve_relay_child(*args.relay_child))
        return 0
    with tempfile.TemporaryDirectory() as raw:
        root = Path(raw)
        identity, times_path = local_identity(root, "relay", "relay", time.time()), root / "crossings.json"
        child = subprocess.Popen(
            [sys.executable, __file__, "--relay-child", str(identity), str(times_path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            relay = (child.stdout.readline() if child.stdout else "").strip()
            figures = asyncio.run(measure(root, relay, os.urandom(args.payload), args.calls))
        finally:
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=30)
        crossings = [seconds * 1000 for seconds in json.loads(times_path.read_text())]
    result = {
        "payload_bytes": args.payload,
        "calls": args.calls,
        "relay_crossing_ms": percentiles(crossings),
        "budget_ms_per_crossing": 0.5,
        **figures,
        "added_rtt_ms_p50": figures["relayed_rtt_ms"]["p50"] - figures["direct_rtt_ms"]["p50"],  # type: ignore[index]
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "measured_at_unix_s": time.time(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
