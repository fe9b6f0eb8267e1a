"""The row exchange's bridge: engine threads that block, streams on one grpc.aio event loop.

Two ``GrpcRowExchange`` ends (nodes 0 and 1 of a group of 2) share one event loop in a thread
of this process, joined by a real loopback ``ExchangeRows`` stream; two plain threads stand in
for the engine threads (no llama.cpp here: the rows are made up, and the model tests show the
exchange inside a graph). The accepting side is a bare servicer that only runs the link (no
admission: ``test_expert_group_tls.py`` checks that against real nodes).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

import grpc.aio
import numpy as np
import pytest

from meshnet.core.errors import DeadlineExceeded, MeshnetError, Unavailable
from meshnet.moe import wire as expert_wire
from meshnet.moe.links import GrpcRowExchange, PeerLink, open_link
from meshnet.moe.loop_thread import LoopThread
from meshnet.moe.ownership import ExchangeGeometry, ExpertOwnership, ExpertRowsConflict, SlotRows, local_rows
from meshnet.security.identity import ANY_WORKER_NAME
from meshnet.wire.tls import secure_or_plain_channel

GEOMETRY = ExchangeGeometry(n_embd=64, n_expert=16, n_expert_used=4, n_layers=2, group_size=2)
SHA = "ab" * 32


class _AcceptRows(expert_wire.ExpertGroupServicer):
    def __init__(self, exchange: GrpcRowExchange) -> None:
        self._exchange = exchange

    async def ExchangeRows(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        opening = await context.read()
        assert isinstance(opening, expert_wire.ExpertRowsFrame)
        link = PeerLink(0, opening.sender, context.write)
        self._exchange.add(link)
        await link.serve(context.read)


@dataclass
class _Pair:
    loop: LoopThread
    nodes: list[GrpcRowExchange]
    server: grpc.aio.Server
    channel: grpc.aio.Channel


async def _connect(timeout_s: float) -> tuple[list[GrpcRowExchange], grpc.aio.Server, grpc.aio.Channel]:
    loop = asyncio.get_running_loop()
    nodes = [GrpcRowExchange(ExpertOwnership(i, 2), GEOMETRY, timeout_s, loop) for i in range(2)]
    server = grpc.aio.server(options=expert_wire.CHANNEL_OPTIONS)
    expert_wire.add_expert_group_servicer(_AcceptRows(nodes[0]), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = secure_or_plain_channel(f"127.0.0.1:{port}", None, ANY_WORKER_NAME, expert_wire.CHANNEL_OPTIONS)
    nodes[1].add(await open_link(channel, 1, 0, SHA))
    await asyncio.wait_for(nodes[0].complete.wait(), 10)
    return nodes, server, channel


@pytest.fixture
def pair_factory() -> Iterator[Callable[[float], _Pair]]:
    made: list[_Pair] = []

    def make(timeout_s: float) -> _Pair:
        loop = LoopThread("node-loop")
        made.append(_Pair(loop, *loop.call(_connect(timeout_s))))
        return made[-1]

    yield make
    for pair in made:
        pair.loop.call(_stop(pair))
        pair.loop.close()


async def _stop(pair: _Pair) -> None:
    for node in pair.nodes:
        node.close()
    await pair.channel.close()
    await pair.server.stop(None)


def _rows(sender: int, sequence: int, layer: int = 0) -> SlotRows:
    rng = np.random.default_rng(sequence)
    selected = np.stack([rng.choice(16, 4, replace=False) for _ in range(3)]).astype(np.int32)
    weighted = rng.standard_normal((3, 4, 64)).astype(np.float32)
    return local_rows(sequence, layer, ExpertOwnership(sender, 2), selected, weighted)


def _in_thread(call: Callable[[], list[SlotRows]]) -> Future[list[SlotRows]]:
    """Run ``call`` on a thread of its own, as a node's engine thread would."""
    future: Future[list[SlotRows]] = Future()

    def run() -> None:
        try:
            future.set_result(call())
        except MeshnetError as error:
            future.set_exception(error)

    threading.Thread(target=run, daemon=True).start()
    return future


def test_each_node_gets_the_others_rows_bit_for_bit(pair_factory: Callable[[float], _Pair]) -> None:
    pair = pair_factory(10.0)
    for sequence in range(20):
        mine = [_rows(0, sequence, sequence % 2), _rows(1, sequence, sequence % 2)]
        calls = [_in_thread(partial(node.exchange, rows)) for node, rows in zip(pair.nodes, mine, strict=True)]
        for i, call in enumerate(calls):
            (got,) = call.result(timeout=10)
            sent = mine[1 - i]
            assert (got.sender, got.sequence, got.layer) == (sent.sender, sent.sequence, sent.layer)
            assert np.array_equal(got.rows.view(np.uint32), sent.rows.view(np.uint32))
            assert np.array_equal(got.experts, sent.experts) and np.array_equal(got.slots, sent.slots)
    assert [node.exchanges for node in pair.nodes] == [20, 20]
    assert all(node.latency_us()[0] > 0 for node in pair.nodes)


def test_a_closed_peer_fails_the_exchange_at_once_not_at_the_deadline(pair_factory: Callable[[float], _Pair]) -> None:
    pair = pair_factory(60.0)  # a wait for the deadline would outlast the result's timeout below
    pair.loop.call(_close(pair.nodes[1]))
    with pytest.raises(Unavailable, match="peer 1 is lost"):
        pair.nodes[0].exchange(_rows(0, 0))  # the stream node 1 opened ended: node 0 knows
    with pytest.raises(Unavailable, match="peer 0 is lost"):
        _in_thread(lambda: pair.nodes[1].exchange(_rows(1, 0))).result(timeout=10)
    assert [pair.loop.call(_connected(node)) for node in pair.nodes] == [0, 0]
    # A node asked for a step between two exchanges names the peer it lost (``ExpertNode.step``).
    assert [node.missing() for node in pair.nodes] == ["peer 1 is lost", "peer 0 is lost"]


def test_a_peer_that_never_connected_is_named_so(pair_factory: Callable[[float], _Pair]) -> None:
    pair = pair_factory(10.0)
    assert [node.missing() for node in pair.nodes] == ["", ""]
    alone = pair.loop.call(_unconnected(ExpertOwnership(1, 3)))
    assert alone.missing() == "peer 0 has not connected, peer 2 has not connected"


async def _unconnected(ownership: ExpertOwnership) -> GrpcRowExchange:
    return GrpcRowExchange(ownership, GEOMETRY, 10.0, asyncio.get_running_loop())


async def _close(node: GrpcRowExchange) -> None:
    node.close()
    await asyncio.sleep(0)


async def _connected(node: GrpcRowExchange) -> int:
    return node.connected


def test_a_silent_peer_ends_the_exchange_at_its_deadline(pair_factory: Callable[[float], _Pair]) -> None:
    pair = pair_factory(0.2)
    with pytest.raises(DeadlineExceeded, match="peer 1 sent no expert rows"):
        pair.nodes[0].exchange(_rows(0, 0))


def test_rows_of_another_exchange_are_refused(pair_factory: Callable[[float], _Pair]) -> None:
    pair = pair_factory(10.0)
    late = _in_thread(lambda: pair.nodes[1].exchange(_rows(1, 5)))
    with pytest.raises(ExpertRowsConflict, match="exchange 5, layer 0; expected exchange 4"):
        pair.nodes[0].exchange(_rows(0, 4))
    with pytest.raises(ExpertRowsConflict, match="exchange 4, layer 0; expected exchange 5"):
        late.result(timeout=10)
