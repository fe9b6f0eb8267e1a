"""What mTLS costs: meshnet-N decode tok/s and per-link latency, secured vs ``--insecure``, one run.

Both variants start the same N worker processes on loopback, one variant at a time (so they never
compete for the cores), alternating over ``rounds`` so drift in machine load falls on both alike.
Each round drives one request of ``tokens`` greedy tokens through the route driver (decode rate:
tokens after the first, over the time after the first) and one frame-by-frame probe
(``hops.probe_hops``: per-link latency, the round trip less the shards' own compute).
``meshnet bench-tls`` writes the JSON this returns.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from meshnet.artifact.describe import describe_model
from meshnet.bench.hops import probe_hops
from meshnet.bench.remote import MeshnetLane
from meshnet.bench.tickets import LaneTickets
from meshnet.bench.tls_config import TlsCostConfig
from meshnet.bench.workers import WorkerOptions, WorkerSet, client_security
from meshnet.core.layers import split_evenly
from meshnet.route.driver import RouteDriver
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.frames import DEFAULT_MAX_FRAME_BYTES

PROMPT = tuple(range(10, 42))
"""32 token ids: a short, fixed prompt; the cost measured is the per-token path."""


async def _one_round(config: TlsCostConfig, secure: bool) -> dict[str, float | None]:
    n_layers, n_embd = _shape(config.model)
    options = WorkerOptions(config.model, config.data_dir, config.threads, 1, 512, 256, secure=secure)
    label = f"tls-{'mtls' if secure else 'insecure'}"
    workers = await asyncio.to_thread(
        WorkerSet, label, split_evenly(n_layers, config.shards), options, config.start_timeout_s
    )
    security = client_security(config.data_dir, secure)
    pool = ChannelPool(DEFAULT_MAX_FRAME_BYTES, security)
    try:
        driver = RouteDriver(pool, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES)
        lane = MeshnetLane(workers, pool, driver, timeout_s=300, tickets=LaneTickets(config.data_dir, security))
        await lane.run((PROMPT,), [0], 4)  # warm: connections made, handshakes done, caches hot
        record = await lane.run((PROMPT,), [0], config.tokens)
        times = record.requests[0].token_times
        decode = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else None
        probe = await probe_hops(
            pool,
            await lane.session(),
            np.array(PROMPT, np.int32),
            config.probe_tokens,
            max_frame_bytes=DEFAULT_MAX_FRAME_BYTES,
            n_embd=n_embd,
        )
        timing = probe.timing
        return {"decode_tokens_per_s": decode, "link_ms_p50": timing.link_ms_p50, "step_ms_p50": timing.step_ms_p50}
    finally:
        await pool.close()
        await asyncio.to_thread(workers.stop)


def _shape(model: Path) -> tuple[int, int]:
    description = describe_model(model)
    return description.n_layers, description.n_embd


def _median(rounds: list[dict[str, float | None]], key: str) -> float | None:
    values = [r[key] for r in rounds if r[key] is not None]
    return statistics.median(values) if values else None  # type: ignore[type-var]


async def measure_tls_cost(config: TlsCostConfig) -> dict[str, Any]:
    """Secured and plaintext rounds, alternating; medians and the secured/plaintext ratios."""
    rounds: dict[str, list[dict[str, float | None]]] = {"mtls": [], "insecure": []}
    for index in range(config.rounds):
        # Alternate which variant goes first, so neither always runs on a warmer machine.
        order = (True, False) if index % 2 == 0 else (False, True)
        for secure in order:
            rounds["mtls" if secure else "insecure"].append(await _one_round(config, secure))
    summary: dict[str, Any] = {
        "lane": f"meshnet-{config.shards}",
        "model": config.model.name,
        "tokens": config.tokens,
        "rounds": config.rounds,
        "measured_at_unix_s": time.time(),
        "variants": {},
    }
    for name, values in rounds.items():
        summary["variants"][name] = {
            "decode_tokens_per_s": _median(values, "decode_tokens_per_s"),
            "link_ms_p50": _median(values, "link_ms_p50"),
            "step_ms_p50": _median(values, "step_ms_p50"),
            "rounds": values,
        }
    secured, plain = summary["variants"]["mtls"], summary["variants"]["insecure"]
    if secured["decode_tokens_per_s"] and plain["decode_tokens_per_s"]:
        summary["mtls_decode_ratio"] = secured["decode_tokens_per_s"] / plain["decode_tokens_per_s"]
    if secured["link_ms_p50"] is not None and plain["link_ms_p50"] is not None:
        summary["mtls_link_ms_added_p50"] = secured["link_ms_p50"] - plain["link_ms_p50"]
    return summary
