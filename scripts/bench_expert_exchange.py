"""The row exchange alone: two processes swap one decode token's slot rows, no llama.cpp.

    python scripts/bench_expert_exchange.py [--exchanges 3000] [--rounds 3]

Each process is one node of a group of 2 (pinned to its own core), built as an expert node
builds its exchange (``moe/links.py``: grpc.aio streams on the process's event loop, the engine
thread blocking on the links' inboxes); a plain thread stands in for the engine and exchanges
rows of 64 experts / top-8 / n_embd 512 (a decode token of ``bench_expert_parallel.py``'s model)
as fast as the peer answers. Prints each node's p50 / p95 / mean wall time per exchange, the
cost the eval callback pays per MoE layer, without the skew between two nodes' graphs that the
whole-model benchmark's figure includes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import time

import grpc.aio
import numpy as np

from meshnet.deploy.expert_launch import free_loopback_port
from meshnet.moe import wire as expert_wire
from meshnet.moe.links import GrpcRowExchange, PeerLink, open_link
from meshnet.moe.ownership import ExchangeGeometry, ExpertOwnership, local_rows
from meshnet.security.identity import ANY_WORKER_NAME
from meshnet.wire.tls import secure_or_plain_channel

GEOMETRY = ExchangeGeometry(n_embd=512, n_expert=64, n_expert_used=8, n_layers=4, group_size=2)
WARMUP = 200


class _AcceptRows(expert_wire.ExpertGroupServicer):
    """Node 0's side of the stream, without the admission a real node does first."""

    def __init__(self, exchange: GrpcRowExchange) -> None:
        self._exchange = exchange

    async def ExchangeRows(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        opening = await context.read()
        if isinstance(opening, expert_wire.ExpertRowsFrame):
            link = PeerLink(0, opening.sender, context.write)
            self._exchange.add(link)
            await link.serve(context.read)


def _engine(exchange: GrpcRowExchange, index: int, count: int) -> list[float]:
    ownership = ExpertOwnership(index, 2)
    selected = np.arange(8, dtype=np.int32)[None, :]  # experts 0-7: four on each node
    weighted = np.random.default_rng(index).random((1, 8, 512), dtype=np.float32)
    durations = []
    for sequence in range(count + WARMUP):
        rows = local_rows(sequence, sequence % 4, ownership, selected, weighted)
        started = time.perf_counter()
        exchange.exchange(rows)
        durations.append(time.perf_counter() - started)
    return durations[WARMUP:]


async def _node(index: int, ports: list[int], count: int) -> list[float]:
    exchange = GrpcRowExchange(ExpertOwnership(index, 2), GEOMETRY, 30.0, asyncio.get_running_loop())
    server = grpc.aio.server(options=expert_wire.CHANNEL_OPTIONS)
    expert_wire.add_expert_group_servicer(_AcceptRows(exchange), server)
    server.add_insecure_port(f"127.0.0.1:{ports[index]}")
    await server.start()
    channel = None
    if index == 1:
        address = f"127.0.0.1:{ports[0]}"
        channel = secure_or_plain_channel(address, None, ANY_WORKER_NAME, expert_wire.CHANNEL_OPTIONS)
        await asyncio.wait_for(channel.channel_ready(), 30)
        exchange.add(await open_link(channel, 1, 0, ""))
    await asyncio.wait_for(exchange.complete.wait(), 30)
    durations = await asyncio.to_thread(_engine, exchange, index, count)
    await asyncio.sleep(0.5)  # the peer takes its last frame before the streams close
    exchange.close()
    if channel is not None:
        await channel.close()
    await server.stop(None)
    return durations


def _process(index: int, ports: list[int], count: int, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    os.sched_setaffinity(0, {index % (os.cpu_count() or 1)})
    durations = np.array(asyncio.run(_node(index, ports, count))) * 1e6
    p50, p95 = np.percentile(durations, [50, 95])
    results.put(
        {"node": index, "p50_us": round(p50, 1), "p95_us": round(p95, 1), "mean_us": round(durations.mean(), 1)}
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exchanges", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    for _ in range(args.rounds):
        ports = [free_loopback_port(), free_loopback_port()]
        results = context.Queue()
        nodes = [context.Process(target=_process, args=(i, ports, args.exchanges, results)) for i in range(2)]
        for node in nodes:
            node.start()
        print(json.dumps(sorted((results.get(timeout=600) for _ in nodes), key=lambda r: r["node"])))
        for node in nodes:
            node.join()


if __name__ == "__main__":
    main()
