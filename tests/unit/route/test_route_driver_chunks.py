"""The driver cuts a prompt from what the route's hops carry: no shard is asked before a request.

A hop's capability is its node's record (the tracker put it in the route), so the sizes below
are what the nodes registered; with the old per-address cache a restarted node was sized by its
previous answer."""

from __future__ import annotations

from meshnet.core.events import RouteHop
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.route.driver import RouteDriver
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.frames import FRAME_OVERHEAD_BYTES

N_EMBD = 64
PROMPT = GenerationRequest(tuple(range(1, 1001)), 4)


def hop(name: str, layers: LayerRange, *, chunk: int = 256, frame_bytes: int = 4 << 20, tokens: int = 2048) -> RouteHop:
    capability = NodeCapability(2048, chunk, tokens, frame_bytes, N_EMBD, 4)
    return RouteHop(NodeId(name), f"{name}:1", layers, capability)


def chunk_sizes(*hops: RouteHop) -> list[int]:
    driver = RouteDriver(ChannelPool(4 << 20), max_frame_bytes=4 << 20)
    return [len(chunk.payload) for chunk in driver.prefill_chunks(PROMPT, hops, 0)]


def test_frames_carry_one_engine_call_of_the_heads_chunk() -> None:
    assert chunk_sizes(hop("h", LayerRange(0, 2)), hop("t", LayerRange(2, 4))) == [256, 256, 256, 232]
    assert chunk_sizes(hop("h", LayerRange(0, 2), chunk=100), hop("t", LayerRange(2, 4))) == [100] * 10


def test_a_hop_that_takes_smaller_frames_bounds_every_frame_of_the_prompt() -> None:
    # Its frames carry hidden rows (4 * n_embd bytes each): 40 rows fit what it accepts.
    small = FRAME_OVERHEAD_BYTES + 4 * N_EMBD * 40
    assert chunk_sizes(hop("h", LayerRange(0, 2)), hop("t", LayerRange(2, 4), frame_bytes=small)) == [40] * 25
    assert chunk_sizes(hop("h", LayerRange(0, 2)), hop("t", LayerRange(2, 4), tokens=300)) == [256, 256, 256, 232]
    assert chunk_sizes(hop("h", LayerRange(0, 2)), hop("t", LayerRange(2, 4), tokens=200)) == [200] * 5
