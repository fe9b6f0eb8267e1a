"""Measure what a KV snapshot of a shard costs against the prefill it saves (issue 31).

    python scripts/measure_kv_snapshot.py --models .data/models --out bench/results/kv-snapshot.json

For SmolLM2-135M and Gemma 3 270M, whole and a head shard of about a third of the layers, it
prefills aligned prompts of several lengths on slot 0 (chunk 256, as served), exports the slot
(``Backend.export_slot``), imports it into slot 1 (``import_slot``) and records the snapshot's
bytes, bytes per position, and the best wall and process-CPU milliseconds of a few exports,
imports and prefills (CPU time sums the threads: on a shared machine it is the steadier figure). Gemma's
windowed layers keep only their window, so its bytes per position fall past 512 positions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.shards import open_llama_shard

CASES = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": (LayerRange(0, 30), LayerRange(0, 10)),
    "gemma-3-270m-q4_k_m.gguf": (LayerRange(0, 18), LayerRange(0, 6)),
}
LENGTHS = (256, 512, 1024)
CHUNK = 256


def _best(action: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Best wall and best process CPU milliseconds of ``repeats`` runs (CPU time, summed over
    threads, is what a loaded machine distorts least)."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeats):
        started, started_cpu = time.perf_counter(), time.process_time()
        action()
        wall = min(wall, time.perf_counter() - started)
        cpu = min(cpu, time.process_time() - started_cpu)
    return round(wall * 1000.0, 2), round(cpu * 1000.0, 2)


def measure(models: Path, threads: int, repeats: int) -> list[dict[str, object]]:
    config = LlamaConfig(n_threads=threads, max_slots=2, n_ctx_per_slot=max(LENGTHS), max_batch_tokens=CHUNK)
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="meshnet-kv-bench-") as folder:
        for name, ranges in CASES.items():
            source = describe_model(models / name)
            for layers in ranges:
                backend = open_llama_shard(source, layers, SliceCache(Path(folder) / name), config)
                rng = np.random.default_rng(31)
                for length in LENGTHS:
                    tokens = rng.integers(300, 30000, length).astype(np.int32)
                    rows.append(_point(backend, name, layers, tokens, repeats))
                backend.close()
    return rows


def _point(backend: LlamaBackend, name: str, layers: LayerRange, tokens: np.ndarray, repeats: int) -> dict[str, object]:
    length = len(tokens)

    def prefill() -> None:
        backend.truncate(0, 0)
        backend.run([StepInput(0, 0, tokens=tokens)])

    prefill_ms, prefill_cpu_ms = _best(prefill, repeats)
    blob = backend.export_slot(0)
    export_ms, export_cpu_ms = _best(lambda: backend.export_slot(0), repeats)
    import_ms, import_cpu_ms = _best(lambda: backend.import_slot(1, blob, length), repeats)
    return {
        "model": name,
        "layers": f"{layers.start}-{layers.stop}",
        "positions": length,
        "snapshot_bytes": len(blob),
        "bytes_per_position": round(len(blob) / length, 1),
        "export_ms": export_ms,
        "import_ms": import_ms,
        "prefill_ms": prefill_ms,
        "export_cpu_ms": export_cpu_ms,
        "import_cpu_ms": import_cpu_ms,
        "prefill_cpu_ms": prefill_cpu_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path(".data/models"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/kv-snapshot.json"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = measure(args.models, args.threads, args.repeats)
    report = {
        "what": "a shard's KV snapshot (export_slot/import_slot) against the prefill it replaces",
        "machine": {"python": platform.python_version(), "machine": platform.machine()},
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "threads": args.threads,
        "prefill_chunk": CHUNK,
        "points": rows,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
