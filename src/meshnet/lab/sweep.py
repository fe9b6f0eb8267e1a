"""``meshnet lab sweep``: the lab's network sweep, one-way delay x link rate, against the physical limit.

Each point builds a fresh lab (the acceptance shape: capped nodes, ``--layers auto``), measures
time to first token, decode rate and the bytes a prefill puts on a seam, and removes the lab.
The physical limit of one decoded token is the shards' compute plus every delay line the token's
round trip crosses. The route is a path today: the gateway drives the head, each shard calls the
next, and the token travels back the same way, so each of the N hops' links is crossed twice
(the gateway reaches even node 0's worker through node 0's delay line): 2N one-way delays. A
ring (head -> ... -> tail -> head) would cross N; both limits are reported, the path's is judged.
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

from meshnet.artifact.describe import describe_model
from meshnet.client.shard_admin import fetch_metrics
from meshnet.client.shard_stream import ChannelPool
from meshnet.lab.lab import Lab, LabConfig
from meshnet.lab.plan import LabNode
from meshnet.lab.swarm import LabSwarm, start_swarm

DELAYS_MS = (0.0, 1.0, 5.0, 20.0)
RATES_MBIT = (100.0, 1000.0)
DECODE_TOKENS = 48
SHORT_TOKENS = 8
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
    """Engine-busy time per decoded token summed over the route's shards (GetMetrics)."""
    limit_path_ms: float
    """compute + 2N one-way delays: the route as it is (a path)."""
    limit_ring_ms: float
    """compute + N one-way delays: a ring's round trip."""
    ratio_to_limit: float
    prefill_prompt_tokens: int
    prefill_ttft_ms: float
    prefill_seam_bytes: int
    """Bytes the kernel counted on the tail's link during a long prompt's prefill (one seam)."""
    prefill_seam_payload_bytes: int
    """The hidden rows themselves: prompt tokens x n_embd x 4 (float32)."""


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
    with httpx.stream("POST", f"{swarm.gateway_url}/v1/chat/completions", json=body, timeout=300) as response:
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


async def _busy(addresses: Sequence[str]) -> float:
    pool = ChannelPool(4 * 1024 * 1024)
    try:
        answers = await asyncio.gather(*(fetch_metrics(pool, address) for address in addresses))
        return sum(values["engine_busy_seconds_total"] for values in answers)
    finally:
        await pool.close()


def _link_bytes(node: LabNode) -> int:
    statistics_dir = Path("/sys/class/net") / node.host_link / "statistics"
    return sum(int((statistics_dir / name).read_text()) for name in ("rx_bytes", "tx_bytes"))


def _compute_ms(swarm: LabSwarm, model: str) -> float:
    """Busy time of a long run minus a short one, per extra token: prefill cancels out."""
    addresses = list(swarm.advertised.values())
    spent = []
    for tokens in (SHORT_TOKENS, DECODE_TOKENS):
        before = asyncio.run(_busy(addresses))
        _stream(swarm, model, PROMPT, tokens)
        spent.append(asyncio.run(_busy(addresses)) - before)
    return 1000.0 * (spent[1] - spent[0]) / (DECODE_TOKENS - SHORT_TOKENS)


def measure_point(lab: Lab, swarm: LabSwarm, n_embd: int) -> SweepPoint:
    config, plan = lab.config, lab.plan
    if plan is None:
        raise RuntimeError("the lab is not built")
    model = config.model_name or describe_model(config.model).name
    _stream(swarm, model, PROMPT, SHORT_TOKENS)  # warm-up: connections, first page faults
    ttfts, gaps = [], []
    for _ in range(REPEATS):
        ttft, arrivals, _ = _stream(swarm, model, PROMPT, DECODE_TOKENS)
        ttfts.append(ttft)
        gaps += [b - a for a, b in itertools.pairwise(arrivals)]
    compute = _compute_ms(swarm, model)
    tail = plan.serving()[-1]
    before = _link_bytes(tail)
    prefill_ttft, _, prompt_tokens = _stream(swarm, model, LONG_PROMPT, 1)
    seam_bytes = _link_bytes(tail) - before
    per_token = 1000.0 * statistics.median(gaps)
    hops = len(plan.serving())
    limit_path = compute + 2 * hops * config.delay_ms
    return SweepPoint(
        delay_ms=config.delay_ms,
        bandwidth_mbit=config.bandwidth_mbit or 0.0,
        ttft_ms=1000.0 * statistics.median(ttfts),
        decode_tok_s=1000.0 / per_token,
        per_token_ms=per_token,
        compute_ms=compute,
        limit_path_ms=limit_path,
        limit_ring_ms=compute + hops * config.delay_ms,
        ratio_to_limit=per_token / limit_path,
        prefill_prompt_tokens=prompt_tokens,
        prefill_ttft_ms=1000.0 * prefill_ttft,
        prefill_seam_bytes=seam_bytes,
        prefill_seam_payload_bytes=prompt_tokens * n_embd * 4,
    )


def run_sweep(base: LabConfig, output: Path, n_embd: int, progress: object = print) -> dict[str, object]:
    """Every point of the grid, each in a lab of its own; writes ``output`` and its plot."""
    points = []
    for rate in RATES_MBIT:
        for delay in DELAYS_MS:
            lab = Lab(dataclasses.replace(base, delay_ms=delay, bandwidth_mbit=rate))
            try:
                lab.build()
                point = measure_point(lab, start_swarm(lab), n_embd)
            finally:
                lab.close()
            points.append(point)
            if callable(progress):
                progress(
                    f"{delay:g} ms x {rate:g} Mbit: {point.per_token_ms:.1f} ms/token "
                    f"(limit {point.limit_path_ms:.1f}, x{point.ratio_to_limit:.2f}), TTFT {point.ttft_ms:.0f} ms"
                )
    results: dict[str, object] = {
        "schema": "meshnet-lab-sweep/1",
        "model": base.model.name,
        "nodes": base.nodes,
        "memory_mb": base.memory_mb,
        "context": base.context,
        "route": "path: gateway -> head -> ... -> tail and back; 2N delay-line crossings per token",
        "created_unix_s": time.time(),
        "points": [dataclasses.asdict(point) for point in points],
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    return results
