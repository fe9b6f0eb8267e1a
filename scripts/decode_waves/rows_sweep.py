"""CPU ms of one llama_decode by rows, per slice: where the per-row cost of a decode call comes from.

    flock /tmp/bench.lock env PYTHONPATH=src python scripts/decode_waves/rows_sweep.py \\
        --out bench/results/v5/waves40-rows-sweep.json

For each SmolLM2 slice (a head takes token ids, any other a random boundary residual) it
prefills 16 sessions, then decodes N rows of the sessions 0..N-1 (consecutive slots: one
ubatch, the same graph every call) in one ``Backend.run``, many times, with
``split_small_decode_batches`` off so every call is one llama_decode. Two tails that differ
only in layers (19:30 and 25:30) separate a layer's cost from the LM head's:
per layer = (t[19:30] - t[25:30]) / 6, LM head and the rest = t[25:30] - 5 x per layer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.shards import open_llama_shard

SLICES = ((0, 19), (19, 30), (25, 30), (0, 30))
ROWS = (1, 2, 3, 4, 6, 7, 8, 12, 16)
PROMPT = 16


def _step(backend: LlamaBackend, slot: int, position: int, n: int, rng: np.random.Generator) -> StepInput:
    if backend.shape.takes_tokens:
        return StepInput(slot, position, tokens=np.full(n, 1000, np.int32))
    return StepInput(slot, position, hidden=rng.standard_normal((n, backend.shape.n_embd)).astype(np.float32))


def sweep(backend: LlamaBackend, calls: int) -> dict[int, float]:
    """Median CPU ms of one call of each row count in ``ROWS``."""
    rng = np.random.default_rng(0)
    for slot in range(max(ROWS)):
        backend.run([_step(backend, slot, 0, PROMPT, rng)])
    costs = {}
    for rows in ROWS:
        spent = []
        for call in range(calls):
            steps = [_step(backend, slot, PROMPT + call, 1, rng) for slot in range(rows)]
            started = time.thread_time()
            backend.run(steps)
            spent.append((time.thread_time() - started) * 1000.0)
        for slot in range(rows):
            backend.truncate(slot, PROMPT)
        costs[rows] = round(statistics.median(spent[3:]), 3)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("/work/main/.data/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--cache", type=Path, default=Path("/work/main/.data/cache"), help="slice cache root")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    source = describe_model(args.model)
    config = LlamaConfig(
        n_threads=1, max_slots=max(ROWS), n_ctx_per_slot=256, max_batch_tokens=64, split_small_decode_batches=False
    )
    load_before = os.getloadavg()
    results = {}
    for start, stop in SLICES:
        backend = open_llama_shard(source, LayerRange(start, stop), SliceCache(args.cache), config)
        results[f"{start}-{stop}"] = sweep(backend, args.calls)
        backend.close()
        print(start, stop, results[f"{start}-{stop}"], flush=True)
    layer = {n: (results["19-30"][n] - results["25-30"][n]) / 6 for n in ROWS}
    report = {
        "what": "median engine-thread CPU ms of one decode call by rows (consecutive slots), 1 thread",
        "model": args.model.name,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "ms_per_call": results,
        "derived_ms_per_layer": {n: round(v, 3) for n, v in layer.items()},
        "derived_ms_lm_head_and_rest": {n: round(results["25-30"][n] - 5 * layer[n], 3) for n in ROWS},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
