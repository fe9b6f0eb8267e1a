"""Synthetic bench results for gate, schema and report tests: every number is chosen by the test."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

N_EMBD = 576


@dataclass(frozen=True)
class Figures:
    """The measured values the v1 contract looks at; the defaults pass every requirement."""

    whole_decode: float = 100.0
    split3_ratio: float = 0.95
    meshnet3_ratio: float = 0.9
    batched8_ratio: float = 0.85
    meshnet3_c8_aggregate: float = 200.0
    recompute_decode: float = 3.0
    context2048_speedup: float = 120.0
    wire_bytes: int = 2600
    meshnet_agreement: float = 1.0
    split_agreement: float = 1.0
    failures: int = 0
    compute_ms: float = 9.0
    link_ms: float = 0.5


def _summary(
    k: int,
    decode: float,
    aggregate: float,
    ratio: float,
    aggregate_ratio: float | None = None,
    occupancy: float | None = None,
) -> dict[str, Any]:
    return {
        "concurrency": k,
        "rounds": 3,
        "requests": 3 * k,
        "failures": 0,
        "errors": [],
        "ttft_ms": 50.0,
        "prefill_tok_s": 2500.0,
        "decode_tok_s": decode,
        "token_latency_ms_p50": 1000.0 / decode,
        "token_latency_ms_p95": 1200.0 / decode,
        "request_latency_ms_p50": 700.0,
        "request_latency_ms_p95": 800.0,
        "aggregate_tok_s": aggregate * 0.8,
        "aggregate_decode_tok_s": aggregate,
        "aggregate_decode_tok_s_rounds": [aggregate, aggregate, aggregate],
        "batch_occupancy": occupancy if occupancy is not None else float(k),
        "vs_reference": {
            "decode_tok_s": ratio,
            "prefill_tok_s": 1.0,
            "aggregate_tok_s": 1.0,
            "aggregate_decode_tok_s": aggregate_ratio if aggregate_ratio is not None else ratio,
        },
        "token_agreement": 1.0,
        "first_divergence": None,
    }


def _lane(
    kind: str,
    shards: int,
    runs: dict[str, Any],
    *,
    agreement: float = 1.0,
    failures: int = 0,
    placement: str = "in-process",
) -> dict[str, Any]:
    return {
        "kind": kind,
        "shards": shards,
        "status": "ok",
        "reason": None,
        "placement": placement,
        "artifact_bytes": 100_000_000,
        "rss_bytes": 300_000_000,
        "rss_bytes_per_process": [300_000_000],
        "rss_note": "test",
        "seams": shards - 1,
        "seam_bytes_per_token": 4.0 * N_EMBD,
        "failures": failures,
        "concurrency": runs,
        "drift": {
            "token_agreement": agreement,
            "compared_tokens": 512,
            "first_divergence": None if agreement == 1.0 else 7,
            "max_logit_diff": 0.0,
            "note": "test",
        },
        "hop_timing": None,
        "wire": None,
    }


def sample_results(figures: Figures = Figures()) -> dict[str, Any]:
    f = figures
    whole_c8 = f.meshnet3_c8_aggregate / f.batched8_ratio
    meshnet_c1 = f.whole_decode * f.meshnet3_ratio
    meshnet = _lane(
        "meshnet",
        3,
        {
            "1": _summary(1, meshnet_c1, meshnet_c1, f.meshnet3_ratio),
            "8": _summary(8, meshnet_c1 / 2, f.meshnet3_c8_aggregate, 0.5, f.batched8_ratio, occupancy=2.0),
        },
        agreement=f.meshnet_agreement,
        failures=f.failures,
        placement="workers",
    )
    meshnet["hop_timing"] = {
        "probe_tokens": 32,
        "step_ms_p50": f.compute_ms + 3 * f.link_ms,
        "step_ms_p95": 20.0,
        "compute_ms_per_token_p50": f.compute_ms,
        "link_ms_p50": f.link_ms,
        "link_ms_p95": 2 * f.link_ms,
        "links": 3,
        "seam_crossings_per_token": 3,
        "hops": [{"address": "127.0.0.1:1", "layers": "0:10", "compute_ms_p50": 3.0, "compute_ms_p95": 4.0}],
    }
    meshnet["wire"] = {
        "links": [],
        "bytes_per_token_per_hop": f.wire_bytes,
        "hidden_payload_bytes": 4 * N_EMBD,
        "framing_bytes_per_message": 14,
        "bytes_per_token_total": 3 * f.wire_bytes,
    }
    return {
        "schema": "meshnet-bench-results",
        "schema_version": 1,
        "run": {
            "timestamp": "2026-01-01T00:00:00+00:00",
            "command": "meshnet bench",
            "quick": False,
            "duration_s": 600.0,
            "time_budget_s": 840.0,
            "rounds_completed": 3,
            "notes": [],
        },
        "model": {
            "path": "/m/model.gguf",
            "name": "Test",
            "sha256": "ab" * 32,
            "bytes": 98_000_000,
            "n_layers": 30,
            "n_embd": N_EMBD,
            "context_length": 8192,
        },
        "environment": {
            "runtime": {"python": "3.11.9", "llama-cpp-python": "0.3.36", "numpy": "2.4.6", "grpcio": "1.85.1"},
            "hardware": {
                "cpu_count": 2,
                "cpu_model": "Test CPU",
                "memory_bytes": 8 * 2**30,
                "platform": "Linux",
                "machine": "x86_64",
                "python_executable": "/usr/bin/python3",
            },
        },
        "workload": {
            "lanes": ["llama-whole", "split-3", "recompute", "meshnet-3"],
            "prompts": 8,
            "prompt_tokens": 128,
            "output_tokens": 64,
            "recompute_output_tokens": 8,
            "sampling": "greedy",
            "threads": 1,
            "concurrency": [1, 8],
            "repetitions": 3,
            "max_slots": 8,
            "n_ctx_per_slot": 2048,
            "prefill_chunk": 256,
            "interleaved": True,
            "sweep_lanes": ["llama-whole", "meshnet-3"],
            "lane_concurrency": [1],
            "contexts": [2048],
            "context_lane": "meshnet-3",
        },
        "lanes": {
            "llama-whole": _lane(
                "llama-whole",
                1,
                {
                    "1": _summary(1, f.whole_decode, f.whole_decode, 1.0),
                    "8": _summary(8, whole_c8 / 8, whole_c8, 1.0),
                },
            ),
            "split-3": _lane(
                "split",
                3,
                {"1": _summary(1, f.whole_decode * f.split3_ratio, 1.0, f.split3_ratio)},
                agreement=f.split_agreement,
            ),
            "recompute": _lane(
                "recompute", 3, {"1": _summary(1, f.recompute_decode, f.recompute_decode, 0.03)}, agreement=0.9
            ),
            "meshnet-3": meshnet,
        },
        "context_scaling": {
            "fast_lane": "meshnet-3",
            "slow_lane": "recompute",
            "note": "test",
            "points": {
                "2048": {
                    "context": 2048,
                    "fast_ms_per_token": 12.0,
                    "fast_ttft_ms": 12.0 * f.context2048_speedup,
                    "fast_tokens_measured": 8,
                    "slow_ms_per_token": 12.0 * f.context2048_speedup,
                    "slow_tokens_measured": 2,
                    "slow_source": "in-process recompute, 2 token(s)",
                    "speedup": f.context2048_speedup,
                    "first_token_agrees": True,
                    "error": None,
                },
            },
        },
        "noise": {
            "rounds": [{"wall_s": 10.0, "machine_busy_cores": 1.0, "own_cores": 1.0, "foreign_cores": 0.0}],
            "foreign_cores_median": 0.0,
        },
    }


def without(results: dict[str, Any], *path: str) -> dict[str, Any]:
    """A deep copy of ``results`` with the entry at ``path`` removed."""
    copied = copy.deepcopy(results)
    node = copied
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return copied


def _prefill_lane(
    lane: str, threads: int, processes: int, ttft_ms: float, ratio: float, busy: list[float]
) -> dict[str, Any]:
    return {
        "lane": lane,
        "threads": threads,
        "processes": processes,
        "pinning": "process 0 -> core 0, process 1 -> core 1" if processes > 1 else "the bench process, not pinned",
        "status": "ok",
        "reason": None,
        "ttft_ms": ttft_ms,
        "ttft_ms_rounds": [ttft_ms, ttft_ms],
        "prefill_tok_s": 2048 / (ttft_ms / 1000.0),
        "vs_whole_1_thread": ratio,
        "first_token": 42,
        "shard_prefill_tok_s": [2048 / (b / 1000.0) for b in busy],
        "shard_busy_ms": busy,
    }


def with_issue15_pinned_figures(
    results: dict[str, Any], *, batched8_ratio: float = 1.6, ttft_ratio: float = 0.6, busy_ms: float = 5000.0
) -> dict[str, Any]:
    """``results`` as schema version 2 with pinned meshnet-2 at concurrency 8 and the prefill phase
    (TTFT of a 2,048-token prompt; whole-model 1 thread takes 13,000 ms)."""
    document = copy.deepcopy(results)
    document["schema_version"] = 2
    whole_c8 = document["lanes"]["llama-whole"]["concurrency"]["8"]["aggregate_decode_tok_s"]
    document["lanes"]["meshnet-2"] = _lane(
        "meshnet",
        2,
        {
            "1": _summary(1, 60.0, 60.0, 0.6),
            "8": _summary(8, 20.0, whole_c8 * batched8_ratio, 0.2, batched8_ratio, occupancy=7.5),
        },
        placement="workers",
    )
    document["run"]["notes"] = ["meshnet-2 workers: process 0 -> core 0, process 1 -> core 1"]
    document["prefill"] = {
        "prompt_tokens": 2048,
        "prefill_chunk": 256,
        "rounds": 2,
        "quick": False,
        "first_token_agrees": True,
        "note": "test",
        "foreign_cores": 0.05,
        "lanes": {
            "llama-whole-1-thread": _prefill_lane("llama-whole", 1, 1, 13000.0, 1.0, []),
            "llama-whole-2-threads": _prefill_lane("llama-whole", 2, 1, 8000.0, 8 / 13, []),
            "meshnet-2-pinned": _prefill_lane("meshnet-2", 1, 2, 13000.0 * ttft_ratio, ttft_ratio, [busy_ms, busy_ms]),
        },
    }
    return document
