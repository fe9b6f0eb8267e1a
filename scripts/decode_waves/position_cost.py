"""What a decoded row costs each slice of a two-shard split as the context grows (issue 34).

    flock /tmp/bench.lock env PYTHONPATH=src python scripts/decode_waves/position_cost.py \\
        --cuts 17 19 --out bench/results/v5/split41/position-cost.json

Loads SmolLM2 through meshnet's own engine (``LlamaBackend``, 1 thread): the head 0:cut and the
tail cut:30 (with the LM head). Eight sessions are prefilled to a start position, then decode
rounds run three waves (slots 0,3,6 / 1,4,7 / 2,5: the pipelined head's wave sizes, sessions
not consecutive, as a route's sessions come) through both slices; the CPU time of each slice's
``run`` is summed per round. Reported: the median CPU ms a row on each slice at each start
position, and their ratio. Weight elements alone would balance the two at cut 19.
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
from meshnet.engine.backend import Backend, StepInput
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.shards import open_llama_shard

SESSIONS = 8
WAVES = ([0, 3, 6], [1, 4, 7], [2, 5])
ROUNDS, WARMUP = 30, 3
POSITIONS = (16, 200, 450, 700)


def through(slices: list[Backend], steps: list[StepInput], costs: list[float] | None) -> None:
    for index, backend in enumerate(slices):
        started = time.thread_time()
        outputs = backend.run(steps)
        if costs is not None:
            costs[index] += (time.thread_time() - started) * 1000.0
        steps = [StepInput(o.slot, s.position, hidden=o.hidden) for o, s in zip(outputs, steps, strict=True)]


def measure(slices: list[Backend], position: int) -> list[float]:
    """Median CPU ms a row on each slice, decoding from ``position``."""
    for slot in range(SESSIONS):
        for backend in slices:
            backend.truncate(slot, 0)
        for start in range(0, position, 64):
            tokens = np.arange(1000 + start, 1000 + min(position, start + 64), dtype=np.int32)
            through(slices, [StepInput(slot, start, tokens=tokens)], None)
    positions = dict.fromkeys(range(SESSIONS), position)
    per_row: list[list[float]] = [[] for _ in slices]
    for round_index in range(WARMUP + ROUNDS):
        costs = [0.0] * len(slices)
        for wave in WAVES:
            through(slices, [StepInput(s, positions[s], tokens=np.array([1000], np.int32)) for s in wave], costs)
            for slot in wave:
                positions[slot] += 1
        if round_index >= WARMUP:
            for index, cost in enumerate(costs):
                per_row[index].append(cost / SESSIONS)
    return [statistics.median(rows) for rows in per_row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path(".data/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--cache", type=Path, default=Path(".data/cache"), help="slice cache root")
    parser.add_argument("--cuts", type=int, nargs="+", default=[17, 19])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    source, cache = describe_model(args.model), SliceCache(args.cache)
    config = LlamaConfig(n_threads=1, max_slots=SESSIONS, n_ctx_per_slot=1024, max_batch_tokens=64)
    load_before = os.getloadavg()
    rows = []
    for cut in args.cuts:
        ranges = (LayerRange(0, cut), LayerRange(cut, source.n_layers))
        slices: list[Backend] = [open_llama_shard(source, r, cache, config) for r in ranges]
        for position in POSITIONS:
            head, tail = measure(slices, position)
            rows.append({"cut": cut, "position": position, "head_ms": round(head, 3), "tail_ms": round(tail, 3)})
            print(f"cut {cut} position {position}: head {head:.3f} ms a row, tail {tail:.3f}, {head / tail:.3f}x")
        for backend in slices:
            backend.close()
    report = {
        "what": "CPU ms a decoded row on each slice (1 thread), 8 sessions in waves 3+3+2, by start position",
        "model": args.model.name,
        "rounds": ROUNDS,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
