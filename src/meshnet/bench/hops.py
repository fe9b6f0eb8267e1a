"""Per-hop timing and wire bytes of a route, from a probe session driven frame by frame.

The route driver hides each step's ``StepResult.timings``; this probe speaks the same frames
through the same ``ShardStream`` so it can keep them, and asks for them (``want_timings``: no
shard measures or sends timings otherwise). Its decode frames are ring frames, as the head's own
decode loop sends them: the tail answers the head directly.
Each decode step's round trip splits into the shards' own time (``compute_us``: engine queue +
llama.cpp, as each shard reports it) and the rest: serialization, gRPC, loopback, event loops,
spread over the one-way crossings of the step (``crossings``: client->head, each seam crossing,
head->client).

Wire bytes per decode token are serialized sizes of the exact frames a decode step sends:
the 1-token frame into the head, the [1, n_embd] float32 hidden frame across each seam, and
the answers (back along the chain, or from the tail to the head on the ring), each plus 14 bytes
of transport framing (5-byte gRPC message prefix, 9-byte HTTP/2 DATA frame header).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from meshnet.bench.results import HopCompute, HopTiming, LinkBytes, WireBytes
from meshnet.bench.stats import percentile
from meshnet.core.errors import IntegrityError
from meshnet.core.generation import SamplingParams
from meshnet.route.route_run import RouteSession, route_frame_meta
from meshnet.route.shard_stream import ChannelPool, ShardStream
from meshnet.wire.frames import StepFrame, StepResult
from meshnet.wire.prefill import split_prefill
from meshnet.wire.shard_wire import frame_to_proto, result_to_proto

TRANSPORT_FRAMING_BYTES = 5 + 9
PROBE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RouteProbe:
    timing: HopTiming
    wire: WireBytes | None


async def probe_hops(
    pool: ChannelPool, route: RouteSession, prompt: np.ndarray, n_tokens: int, *, max_frame_bytes: int, n_embd: int
) -> RouteProbe:
    """Prefill ``prompt``, decode ``n_tokens`` one by one, and report timings and wire bytes."""
    stream = ShardStream(pool, route.hops[0].address, PROBE_TIMEOUT_S, route.hops[0].node_id)
    downstream = route.downstream()
    rows = max(1, (max_frame_bytes - 65536) // (4 * n_embd))
    try:
        result: StepResult | None = None
        chunks = split_prefill(prompt, 0, max_frame_bytes, max_tokens=rows)
        for step, chunk in enumerate(chunks):
            frame = StepFrame(
                meta=route_frame_meta(route, step, chunk.position, "prefill"),
                tokens=np.ascontiguousarray(chunk.payload),
                downstream=downstream if step == 0 else (),
                sampling=SamplingParams() if step == 0 else None,
                ticket=route.ticket if step == 0 else None,
                final_chunk=chunk.final_chunk,
                ring=step > 0,
            )
            result = await stream.exchange(frame)
        step = len(chunks)
        round_trips: list[float] = []
        timings: list[StepResult] = []
        decode: StepFrame | None = None
        for _ in range(n_tokens):
            if result is None or result.token_id is None:
                raise IntegrityError("the route answered a final chunk without a token")
            decode = StepFrame(
                meta=route_frame_meta(route, step, result.next_position, "decode"),
                tokens=np.array([result.token_id], np.int32),
                ring=True,
                want_timings=True,
            )
            begun = time.perf_counter()
            result = await stream.exchange(decode)
            round_trips.append(time.perf_counter() - begun)
            timings.append(result)
            step += 1
    finally:
        stream.cancel()  # frees the session's KV on every shard down the route
    wire = wire_bytes(route, decode, timings[-1], n_embd) if decode is not None and timings else None
    return RouteProbe(_timing_summary(route, round_trips, timings), wire)


def seam_crossings(n_shards: int) -> int:
    """Seam crossings per decode token on the ring: N (none for a single shard)."""
    return n_shards if n_shards >= 2 else 0


def _timing_summary(route: RouteSession, round_trips: list[float], results: list[StepResult]) -> HopTiming:
    n_links = 2 + seam_crossings(len(route.hops))  # client->head and head->client, and the seams
    hops = []
    for index, hop in enumerate(route.hops):
        compute = [r.timings[index].compute_us / 1000.0 for r in results if len(r.timings) > index]
        layers = f"{hop.layers.start}:{hop.layers.stop}"
        hops.append(HopCompute(hop.address, layers, percentile(compute, 50.0), percentile(compute, 95.0)))
    totals = [sum(t.compute_us for t in r.timings) / 1000.0 for r in results]
    rtt = [s * 1000.0 for s in round_trips]
    # What the shards did not account for, shared out over the links of the route.
    link = [max(total - shards, 0.0) / n_links for total, shards in zip(rtt, totals, strict=True)]
    return HopTiming(
        probe_tokens=len(results),
        step_ms_p50=percentile(rtt, 50.0),
        step_ms_p95=percentile(rtt, 95.0),
        compute_ms_per_token_p50=percentile(totals, 50.0),
        link_ms_p50=percentile(link, 50.0),
        link_ms_p95=percentile(link, 95.0),
        links=n_links,
        hops=tuple(hops),
        seam_crossings_per_token=seam_crossings(len(route.hops)),
    )


def _framed(size: int) -> int:
    return size + TRANSPORT_FRAMING_BYTES


def wire_bytes(route: RouteSession, decode_frame: StepFrame, answer: StepResult, n_embd: int) -> WireBytes:
    """Serialized bytes each link carries per decode token, out and back (the ring's own link
    from the tail to the head carries the answer as its forward bytes)."""
    head = route.hops[0].address
    plain = replace(decode_frame, want_timings=False)
    reply = replace(answer, timings=())
    reply_bytes = _framed(result_to_proto(reply).ByteSize())
    links = [LinkBytes(f"client->{head}", _framed(frame_to_proto(plain).ByteSize()), reply_bytes)]
    ring = len(route.hops) >= 2
    hidden = np.zeros((1, n_embd), np.float32)  # hidden: [1, n_embd], as each seam sends per token
    for index, hop in enumerate(route.hops[1:], start=1):
        # The frame a shard forwards: the step's header re-addressed to the next range.
        meta = replace(decode_frame.meta, layers=hop.layers, deadline_ms=None)
        forwarded = StepFrame(meta=meta, hidden=hidden, ring=ring)
        link = f"{route.hops[index - 1].address}->{hop.address}"
        links.append(LinkBytes(link, _framed(frame_to_proto(forwarded).ByteSize()), 0 if ring else reply_bytes))
    if ring:
        links.append(LinkBytes(f"{route.hops[-1].address}->{head} (ring)", reply_bytes, 0))
    seams = links[1:] or links
    return WireBytes(
        links=tuple(links),
        bytes_per_token_per_hop=max(link.forward_bytes + link.backward_bytes for link in seams),
        hidden_payload_bytes=4 * n_embd,
        framing_bytes_per_message=TRANSPORT_FRAMING_BYTES,
        bytes_per_token_total=sum(link.forward_bytes + link.backward_bytes for link in links),
    )
