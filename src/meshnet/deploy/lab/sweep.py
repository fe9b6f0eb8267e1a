"""``meshnet lab sweep``: the lab's network sweep, one-way delay x link rate, against the physical limit.

Each point builds a fresh lab (the acceptance shape: capped nodes, ``--layers auto``), measures
time to first token, decode rate and the bytes a prefill puts on a seam, and removes the lab.
The physical limit of one decoded token is what it costs on the same links without delay (the
shards' compute and every per-hop cost but the delay, measured at 0 ms) plus every delay line the
token's loop crosses. The route is a ring: each shard calls the next and the tail hands the
sampled token straight back to the head (``RingReturn``), so a token crosses N one-way delays,
the least any loop through N machines can. The path a route used before (the token travelling
back through every shard, 2(N-1) delays) is reported beside it; the ring's limit is judged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from meshnet.core.errors import InvalidArgument
from meshnet.deploy.lab.lab import Lab, LabConfig
from meshnet.deploy.lab.plan import SWEEP_DELAYS_MS, SWEEP_RATES_MBIT, LabNode
from meshnet.deploy.lab.swarm import LabSwarm, admin_security, client_auth, served_name, start_swarm
from meshnet.route.shard_admin import fetch_metrics
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.tls import LinkSecurity

DECODE_TOKENS = 48
SHORT_TOKENS = 8
"""The warm-up request's length."""
REPEATS = 3
PROMPT = "Write one sentence about the sea."
LONG_PROMPT = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 30)


@dataclass(frozen=True)
class SweepPoint:
    delay_ms: float
    bandwidth_mbit: float
    ttft_ms: float
    """Median time from sending the request to the first streamed token (short prompt)."""
    decode_tok_s: float
    per_token_ms: float
    """Median time between streamed tokens after the first."""
    compute_ms: float
    """Engine-busy time per decode step summed over the route's shards (GetMetrics). Recorded,
    not judged by: it is wall time around each engine call with the prompt's prefill included, and
    on a shared 2-core machine it came out above the per-token time itself."""
    prefill_prompt_tokens: int
    prefill_ttft_ms: float
    prefill_seam_bytes: int
    """Bytes the kernel counted on the tail's link during a long prompt's prefill (one seam)."""
    prefill_seam_payload_bytes: int
    """The hidden rows themselves: prompt tokens x n_embd x 4 (float32)."""
    limit_path_ms: float = 0.0
    """Per-token time of the same links at 0 ms delay (compute and every per-hop cost but the
    delay) + 2(N-1) one-way delays: the route as it is (a path)."""
    limit_ring_ms: float = 0.0
    """The same base + N one-way delays: a ring's round trip."""
    ratio_to_limit: float = 0.0


def _stream(swarm: LabSwarm, model: str, prompt: str, tokens: int) -> tuple[float, list[float], int]:
    """(TTFT s, arrival times of the tokens, prompt tokens) of one greedy streamed chat."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent, arrivals, prompt_tokens = time.monotonic(), [], 0
    url = f"{swarm.gateway_url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=300, headers=client_auth(swarm)) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                prompt_tokens = int(chunk["usage"]["prompt_tokens"])
            if any(choice["delta"].get("content") for choice in chunk.get("choices", ())):
                arrivals.append(time.monotonic())
    return (arrivals[0] - sent if arrivals else float("nan")), arrivals, prompt_tokens


async def _engine_figures(addresses: Sequence[str], security: LinkSecurity) -> list[tuple[float, float]]:
    """(engine busy seconds, decode steps) of each worker, as counted since it started."""
    pool = ChannelPool(4 * 1024 * 1024, security)
    try:
        answers = await asyncio.gather(*(fetch_metrics(pool, address) for address in addresses))
        return [(values["engine_busy_seconds_total"], values["decode_steps_total"]) for values in answers]
    finally:
        await pool.close()


def _compute_ms(before: Sequence[tuple[float, float]], after: Sequence[tuple[float, float]]) -> float:
    """Engine time per decode step, summed over the shards: what a token costs without the network.

    A request's prefill is in the busy time too; with 48 tokens per ~30-token prompt it adds a
    few percent, so the limit is if anything generous."""
    total = 0.0
    for (busy_0, steps_0), (busy_1, steps_1) in zip(before, after, strict=True):
        if steps_1 > steps_0:
            total += (busy_1 - busy_0) / (steps_1 - steps_0)
    return 1000.0 * total


def _link_bytes(node: LabNode) -> int:
    statistics_dir = Path("/sys/class/net") / node.host_link / "statistics"
    return sum(int((statistics_dir / name).read_text()) for name in ("rx_bytes", "tx_bytes"))


def measure_point(lab: Lab, swarm: LabSwarm, n_embd: int) -> SweepPoint:
    config, plan = lab.config, lab.plan
    if plan is None:
        raise RuntimeError("the lab is not built")
    model = served_name(config)
    _stream(swarm, model, PROMPT, SHORT_TOKENS)  # warm-up: connections, first page faults
    ttfts, gaps = [], []
    route = list(swarm.advertised.values())
    admin = admin_security(lab, "lab-sweep")
    before = asyncio.run(_engine_figures(route, admin))
    for _ in range(REPEATS):
        ttft, arrivals, _ = _stream(swarm, model, PROMPT, DECODE_TOKENS)
        ttfts.append(ttft)
        gaps += [b - a for a, b in itertools.pairwise(arrivals)]
    compute = _compute_ms(before, asyncio.run(_engine_figures(route, admin)))
    tail = plan.serving()[-1]
    link_before = _link_bytes(tail)
    prefill_ttft, _, prompt_tokens = _stream(swarm, model, LONG_PROMPT, 1)
    seam_bytes = _link_bytes(tail) - link_before
    per_token = 1000.0 * statistics.median(gaps)
    return SweepPoint(
        delay_ms=config.delay_ms,
        bandwidth_mbit=config.bandwidth_mbit or 0.0,
        ttft_ms=1000.0 * statistics.median(ttfts),
        decode_tok_s=1000.0 / per_token,
        per_token_ms=per_token,
        compute_ms=compute,
        prefill_prompt_tokens=prompt_tokens,
        prefill_ttft_ms=1000.0 * prefill_ttft,
        prefill_seam_bytes=seam_bytes,
        prefill_seam_payload_bytes=prompt_tokens * n_embd * 4,
    )


def with_limits(points: Sequence[SweepPoint], hops: int) -> list[SweepPoint]:
    """Each point judged against the 0 ms point of its link rate plus the delays its loop crosses."""
    judged = []
    for point in points:
        base = next((p for p in points if p.bandwidth_mbit == point.bandwidth_mbit and p.delay_ms == 0.0), None)
        if base is None:
            raise InvalidArgument(f"no 0 ms point at {point.bandwidth_mbit:g} Mbit to judge the others by")
        path = base.per_token_ms + 2 * (hops - 1) * point.delay_ms
        ring = base.per_token_ms + hops * point.delay_ms
        judged.append(
            dataclasses.replace(point, limit_path_ms=path, limit_ring_ms=ring, ratio_to_limit=point.per_token_ms / ring)
        )
    return judged


def run_sweep(
    base: LabConfig,
    output: Path,
    n_embd: int,
    progress: object = print,
    *,
    delays_ms: Sequence[float] = SWEEP_DELAYS_MS,
    rates_mbit: Sequence[float] = SWEEP_RATES_MBIT,
) -> dict[str, object]:
    """Every point of the grid, each in a lab of its own; writes ``output`` and its plot."""
    points = []
    for rate in rates_mbit:
        for delay in delays_ms:
            lab = Lab(dataclasses.replace(base, delay_ms=delay, bandwidth_mbit=rate))
            try:
                lab.build()
                point = measure_point(lab, start_swarm(lab), n_embd)
            finally:
                lab.close()
            points.append(point)
            if callable(progress):
                progress(
                    f"{delay:g} ms x {rate:g} Mbit: {point.per_token_ms:.1f} ms/token, TTFT {point.ttft_ms:.0f} ms"
                )
    points = with_limits(points, base.nodes)
    results: dict[str, object] = {
        "schema": "meshnet-lab-sweep/2",
        "model": base.model.name,
        "nodes": base.nodes,
        "memory_mb": base.memory_mb,
        "context": base.context,
        "route": "ring: head -> ... -> tail, the tail returns each token to the head; N delay-line crossings per token",
        "limit": "per-token time at 0 ms delay on the same link rate + N one-way delays (path: + 2(N-1))",
        "created_unix_s": time.time(),
        "points": [dataclasses.asdict(point) for point in points],
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    return results
