"""Benchmark expert parallelism: whole model vs an EP-2 group of real processes, each pinned to its own core.

    python scripts/bench_expert_parallel.py [--out bench/results/expert_parallel.json]

A synthetic qwen3moe big enough that routed-expert reads dominate decode is served by one
``meshnet worker --experts 0/1`` process (whole model, core 0) and by two ``--experts I/2``
processes (cores 0 and 1). Both are driven through the same gRPC driver with the same greedy
decode; the logits are checked bit-identical, then decode tok/s, per-layer exchange latency
p50/p95, frame bytes per token and each node's resident memory are recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from gguf import GGMLQuantizationType as Quant

from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.deploy.expert_launch import expert_group_specs, expert_node, model_mapping_rss
from meshnet.engine.backend import StepInput
from meshnet.moe.group_client import ExpertGroupClient
from meshnet.moe.shape import read_moe_shape
from meshnet.process.launcher import launch_all, stop_all

SPEC = SyntheticSpec(
    architecture="qwen3moe",
    n_layers=4,
    n_embd=512,
    n_ff=512,
    n_head=8,
    n_head_kv=4,
    n_expert=64,
    n_expert_used=8,
    n_ff_expert=512,
    weight_type=Quant.Q8_0,
)
PROMPT, DECODE = 64, 48


def _run_group(work: Path, model: Path, size: int, settings: Mapping[str, Any] | None = None) -> dict[str, object]:
    node = replace(
        expert_node(work / "data", model, size),
        threads=1,
        max_sessions=1,
        n_ctx_per_session=256,
        prefill_chunk=64,
        **(settings or {}),
    )
    peers, specs = expert_group_specs(node, work, pin_cores=True)
    children = launch_all(specs, 600)
    try:
        group = ExpertGroupClient(peers, step_timeout_s=120)
        prompt = np.random.default_rng(1).integers(3, 290, PROMPT).astype(np.int32)
        logits = group.run([StepInput(0, 0, tokens=prompt)])[0].logits
        tokens, trace = [], []
        started = time.perf_counter()
        for step in range(DECODE):
            token = int(np.argmax(logits[-1]))  # type: ignore[index]
            tokens.append(token)
            logits = group.run([StepInput(0, PROMPT + step, tokens=np.array([token], np.int32))])[0].logits
            trace.append(logits.tobytes())  # type: ignore[union-attr]
        elapsed = time.perf_counter() - started
        nodes = group.describe()  # counters after the run
        group.close()
        return {
            "nodes": size,
            "decode_tok_s": DECODE / elapsed,
            "tokens": tokens,
            "trace": trace,
            "rss_bytes": [psutil.Process(c.pid).memory_info().rss for c in children],
            "model_mapping_rss_bytes": [model_mapping_rss(c.pid) for c in children],
            "released_expert_bytes": [n.released_expert_bytes for n in nodes],
            "exchange_p50_us": [n.exchange_p50_us for n in nodes],
            "exchange_p95_us": [n.exchange_p95_us for n in nodes],
            "exchanges": [n.exchanges for n in nodes],
            "frame_bytes_sent_per_token": [n.frame_bytes_sent / (DECODE + 1) for n in nodes],
            "expert_cache_bytes": [n.expert_cache_bytes for n in nodes],
            "expert_cache_hit_rate": [
                n.expert_cache_hits / max(n.expert_cache_hits + n.expert_cache_misses, 1) for n in nodes
            ],
            "expert_cache_bytes_read": [n.expert_cache_bytes_read for n in nodes],
        }
    finally:
        stop_all(children)


EXCHANGE_FIGURES = ("decode_tok_s", "exchange_p50_us", "exchange_p95_us", "exchanges")
"""What ``--exchange-only`` prints per round: the cost of the row exchange alone."""
CACHE_FRACTIONS = (0.125, 0.25, 0.5, 1.0)


def _cache_curve(
    work: Path,
    model: Path,
    routed_bytes: int,
    settings: Mapping[str, Any] | None = None,
    fractions: tuple[float, ...] = CACHE_FRACTIONS,
) -> dict[str, object]:
    """Decode tok/s of one node (the whole model) against its expert cache's size, and against the
    page-cache-only baseline (no --expert-cache-mb: every expert mapped, the page cache holds them).
    ``settings``: worker settings of every run, the baseline's included (``repack=False``)."""
    baseline = _run_group(work, model, 1, settings)
    trace = baseline.pop("trace")
    curve, identical = [], True
    for fraction in fractions:
        megabytes = routed_bytes * fraction / 1e6
        run = _run_group(work, model, 1, {**(settings or {}), "expert_cache_mb": round(megabytes, 3)})
        identical = identical and run.pop("trace") == trace
        curve.append(
            {
                "cache_fraction_of_routed": fraction,
                "cache_mb": megabytes,
                "decode_tok_s": run["decode_tok_s"],
                "hit_rate": run["expert_cache_hit_rate"][0],  # type: ignore[index]
                "bytes_read": run["expert_cache_bytes_read"][0],  # type: ignore[index]
                "model_mapping_rss_bytes": run["model_mapping_rss_bytes"][0],  # type: ignore[index]
                "speed_vs_page_cache": run["decode_tok_s"] / baseline["decode_tok_s"],  # type: ignore[operator]
            }
        )
    return {
        "page_cache_only": {k: baseline[k] for k in ("decode_tok_s", "model_mapping_rss_bytes", "rss_bytes")},
        "curve": curve,
        "logits_bit_identical": identical,
        "note": "one node (experts 0/1), prompt and decode as above; a miss preads the expert from the "
        "GGUF after its pages were dropped from the page cache (posix_fadvise DONTNEED)",
    }


def _cache_curve_q4_0(work: Path) -> dict[str, object]:
    """The same model in Q4_0, which llama.cpp repacks at load unless told not to: the cache bounds
    it loaded with --no-repack (baseline and cache runs alike); the repacked page-cache run beside."""
    model = work / "moe-q4_0.gguf"
    if not model.exists():
        write_synthetic_model(model, replace(SPEC, weight_type=Quant.Q4_0))
    repacked = _run_group(work, model, 1)
    repacked.pop("trace")
    result = _cache_curve(work, model, read_moe_shape(model).routed_bytes, {"repack": False}, (0.25, 1.0))
    result["repacked_page_cache_only"] = {
        k: repacked[k] for k in ("decode_tok_s", "model_mapping_rss_bytes", "rss_bytes")
    }
    result["file_bytes"] = model.stat().st_size
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("bench/results/expert_parallel.json"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/meshnet-bench-ep"))
    parser.add_argument("--cache-only", action="store_true", help="add the expert-cache curve to --out, nothing else")
    parser.add_argument("--q4-0-only", action="store_true", help="add the Q4_0 --no-repack cache rows to --out")
    parser.add_argument(
        "--exchange-only", action="store_true", help="print EP-2 exchange latency and tok/s per round, write nothing"
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    model = args.work / "moe.gguf"
    if not model.exists():
        write_synthetic_model(model, SPEC)
    moe = read_moe_shape(model)
    if args.q4_0_only:
        result = json.loads(args.out.read_text())
        result["expert_cache_q4_0_no_repack"] = _cache_curve_q4_0(args.work)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["expert_cache_q4_0_no_repack"], indent=1))
        return
    if args.exchange_only:
        for _ in range(args.rounds):
            split = _run_group(args.work, model, 2)
            print(json.dumps({k: split[k] for k in EXCHANGE_FIGURES}))
        return
    if args.cache_only:
        result = json.loads(args.out.read_text())
        result["expert_cache"] = _cache_curve(args.work, model, moe.routed_bytes)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["expert_cache"]["curve"], indent=1))
        return
    rounds, identical = [], True
    for _ in range(args.rounds):  # interleaved: load from other jobs hits both lanes alike
        whole, split = _run_group(args.work, model, 1), _run_group(args.work, model, 2)
        identical = identical and whole.pop("trace") == split.pop("trace")
        rounds.append({"whole_tok_s": whole["decode_tok_s"], "ep2_tok_s": split["decode_tok_s"]})
    ratios = [r["ep2_tok_s"] / r["whole_tok_s"] for r in rounds]
    result = {
        "model": {
            "spec": {k: (v.name if hasattr(v, "name") else v) for k, v in SPEC.__dict__.items()},
            "file_bytes": model.stat().st_size,
            "routed_expert_bytes": moe.routed_bytes,
        },
        "decode_tokens": DECODE,
        "prompt_tokens": PROMPT,
        "pinning": "each node process on its own core (taskset -c I)",
        "logits_bit_identical": identical,
        "whole": whole,
        "ep2": split,
        "rounds": rounds,
        "ep2_speedup_per_round": ratios,
        "ep2_speedup_median": float(np.median(ratios)),
        "expert_cache": _cache_curve(args.work, model, moe.routed_bytes),
        "expert_cache_q4_0_no_repack": _cache_curve_q4_0(args.work),
        "cpu_count": os.cpu_count(),
        "note": "shared 2-core machine with other jobs running: tok/s are indicative, ratios noisy; "
        "whole/ep2 details are the last round's",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("logits_bit_identical", "ep2_speedup_per_round")}))


if __name__ == "__main__":
    main()
