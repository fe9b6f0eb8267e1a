"""What a decode wave costs per row on llama.cpp's CPU engine, by wave pattern (issue 34).

    flock /tmp/bench.lock env PYTHONPATH=src python scripts/decode_waves/decode_cost.py \\
        --out bench/results/v5/waves40-decode-cost.json

Loads SmolLM2 through meshnet's own engine (``LlamaBackend``): the head and tail slices a pinned
``meshnet-2`` route serves (``DecodeWork.split(2)``), and the whole model. It prefills a short
prompt into each of N sessions (slots), then decodes one token per session per round, the
round's sessions cut into waves (one ``Backend.run`` each) by a pattern: all in one call, equal
halves, the head's current waves (``scheduler.wave_size``), one row per call, ... A rotating
pattern shifts which sessions share a wave every round (the worst case for llama.cpp's graph
reuse, which reuses the previous call's graph only for the same rows of the same sessions, and
for its ubatches: one per run of consecutive slots).

Every pattern runs on three sets of contexts, interleaved round by round so the machine's load
drifts over all alike: ``one_call`` (each wave one llama_decode: the engine before issue 34's
waves40 change), ``one_call_no_reuse`` (the same with llama.cpp's graph reuse off:
``LLAMA_GRAPH_REUSE_DISABLE`` is read when a context is created), ``rowwise`` (a tail's waves
under 8 rows one row per call: ``LlamaConfig.split_small_decode_batches`` as the waves40 change
served it) and ``measured`` (as served now: the threshold measured at start-up on this CPU).
The cost measured is the CPU time of this thread around each ``run`` (``time.thread_time``; at
one thread llama.cpp computes on the caller's thread), which other processes on a loaded machine
distort far less than wall time. Each pattern's sessions restart from the prompt (KV truncated)
so every pattern decodes the same positions (all under 256: one KV view size, ``n_kv``).

Reported per pattern and shard: the median and p90 over rounds of a round's CPU ms per row,
rows/s of CPU (1000 / median), the median CPU ms of one wave, and how many of the llama.cpp
graph runs (ubatches) reused the previous one's graph.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import decode_work, describe_model
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.shards import open_llama_shard
from meshnet.session.scheduler import pipeline_waves, wave_size

REUSE_SWITCH = "LLAMA_GRAPH_REUSE_DISABLE"
"""llama.cpp's environment switch (src/llama-context.cpp), read once per context."""
PROMPT_TOKENS = 16
TOKEN = 1000
"""The token every decode step feeds the head: the cost does not depend on which one."""


@dataclass(frozen=True)
class Pattern:
    name: str
    sizes: tuple[int, ...]
    """Rows of each wave of a round, in order; they sum to the sessions."""
    rotating: bool = False
    """Shift the sessions' order by one each round, so waves change members."""

    def waves(self, sessions: int, round_index: int) -> list[list[int]]:
        shift = round_index % sessions if self.rotating else 0
        order = [*range(shift, sessions), *range(shift)]
        waves, start = [], 0
        for size in self.sizes:
            waves.append(order[start : start + size])
            start += size
        return waves


def patterns(sessions: int) -> list[Pattern]:
    """The patterns measured for ``sessions`` decoding sessions."""
    head = wave_size(sessions, sessions, pipeline_waves(takes_tokens=True, emits_logits=False, route_shards=2))
    current = _cut(sessions, head)
    chosen = [
        Pattern(f"1x{sessions} (one call)", (sessions,)),
        Pattern(f"halves {sessions // 2}+{sessions // 2}", _cut(sessions, sessions // 2)),
        Pattern("halves, rotating", _cut(sessions, sessions // 2), rotating=True),
        Pattern(f"current waves {'+'.join(map(str, current))}", current),
        Pattern("current waves, rotating", current, rotating=True),
        Pattern(f"quarters {'+'.join(map(str, _cut(sessions, sessions // 4)))}", _cut(sessions, sessions // 4)),
        Pattern(f"{sessions}x1 (one row a call)", _cut(sessions, 1)),
    ]
    return chosen


def _cut(sessions: int, size: int) -> tuple[int, ...]:
    return tuple(min(size, sessions - start) for start in range(0, sessions, size))


@dataclass
class Shards:
    """One route (head then tail) or one whole model, all made with the same settings."""

    backends: list[LlamaBackend]

    def round_trip(self, wave: Sequence[int], positions: dict[int, int], costs: list[list[float]]) -> None:
        """Decode one step of ``wave``'s sessions through every shard; append each shard's CPU ms."""
        steps = [StepInput(slot, positions[slot], tokens=np.array([TOKEN], np.int32)) for slot in wave]
        for index, backend in enumerate(self.backends):
            started = time.thread_time()
            outputs = backend.run(steps)
            costs[index].append((time.thread_time() - started) * 1000.0)
            steps = [StepInput(o.slot, positions[o.slot], hidden=o.hidden) for o in outputs if o.hidden is not None]
        for slot in wave:
            positions[slot] += 1

    def prefill(self, sessions: int) -> dict[int, int]:
        for slot in range(sessions):
            for backend in self.backends:
                backend.truncate(slot, 0)
            self.round_trip_prompt(slot)
        return dict.fromkeys(range(sessions), PROMPT_TOKENS)

    def round_trip_prompt(self, slot: int) -> None:
        tokens = np.arange(TOKEN, TOKEN + PROMPT_TOKENS, dtype=np.int32)
        steps = [StepInput(slot, 0, tokens=tokens)]
        for backend in self.backends:
            outputs = backend.run(steps)
            steps = [StepInput(slot, 0, hidden=o.hidden) for o in outputs if o.hidden is not None]

    def rewind(self, positions: dict[int, int]) -> None:
        for slot in positions:
            for backend in self.backends:
                backend.truncate(slot, PROMPT_TOKENS)
            positions[slot] = PROMPT_TOKENS

    def reused(self) -> list[int]:
        return [b.graphs_reused() for b in self.backends]


@contextmanager
def graph_reuse(enabled: bool) -> Iterator[None]:
    previous = os.environ.pop(REUSE_SWITCH, None)
    if not enabled:
        os.environ[REUSE_SWITCH] = "1"
    try:
        yield
    finally:
        os.environ.pop(REUSE_SWITCH, None)
        if previous is not None:
            os.environ[REUSE_SWITCH] = previous


VARIANTS = {
    "one_call": (True, False, None),
    "one_call_no_reuse": (False, False, None),
    "rowwise": (True, True, 8),
    "measured": (True, True, None),
}
"""Name: (llama.cpp graph reuse, ``split_small_decode_batches``, ``lm_head_batch_from``): ``rowwise``
is a tail's small waves one row per call below 8 rows whatever the CPU (the waves40 engine),
``measured`` the engine as served now (the threshold measured at start-up: ``engine.call_costs``)."""


def open_layout(model: Path, cache: SliceCache, ranges: list[LayerRange], config: LlamaConfig) -> dict[str, Shards]:
    source = describe_model(model)
    opened = {}
    for name, (reuse, rowwise, batch_from) in VARIANTS.items():
        variant = replace(config, split_small_decode_batches=rowwise, lm_head_batch_from=batch_from)
        with graph_reuse(reuse):
            opened[name] = Shards([open_llama_shard(source, r, cache, variant) for r in ranges])
    return opened


def measure_pattern(
    layouts: dict[str, Shards], pattern: Pattern, sessions: int, rounds: int, warmup: int
) -> dict[str, object]:
    """Runs ``pattern`` on every layout, alternating layouts round by round."""
    state = {name: shards.prefill(sessions) for name, shards in layouts.items()}
    per_wave: dict[str, list[list[float]]] = {name: [[] for _ in s.backends] for name, s in layouts.items()}
    per_row: dict[str, list[list[float]]] = {name: [[] for _ in s.backends] for name, s in layouts.items()}
    reused_before: dict[str, list[int]] = {}
    for round_index in range(warmup + rounds):
        if round_index == warmup:
            reused_before = {name: s.reused() for name, s in layouts.items()}
        for name, shards in layouts.items():
            costs: list[list[float]] = [[] for _ in shards.backends]
            for wave in pattern.waves(sessions, round_index):
                shards.round_trip(wave, state[name], costs)
            if round_index >= warmup:
                for index, shard_costs in enumerate(costs):
                    per_wave[name][index].extend(shard_costs)
                    per_row[name][index].append(sum(shard_costs) / sessions)
    waves = rounds * len(pattern.sizes)
    result: dict[str, object] = {"pattern": pattern.name, "sizes": pattern.sizes, "rotating": pattern.rotating}
    for name, shards in layouts.items():
        reused = [after - before for after, before in zip(shards.reused(), reused_before[name], strict=True)]
        result[name] = [
            _summary(per_row[name][i], per_wave[name][i]) | {"waves": waves, "graphs_reused": reused[i]}
            for i in range(len(shards.backends))
        ]
        shards.rewind(state[name])
    return result


def _summary(round_ms_per_row: list[float], wave_ms: list[float]) -> dict[str, float | int]:
    ordered = sorted(round_ms_per_row)
    median = statistics.median(ordered)
    return {
        "ms_per_row_median": round(median, 4),
        "ms_per_row_p90": round(ordered[int(0.9 * (len(ordered) - 1))], 4),
        "cpu_rows_per_s": round(1000.0 / median, 1),
        "ms_per_wave_median": round(statistics.median(wave_ms), 4),
    }


def run_layout(
    name: str, model: Path, cache: SliceCache, ranges: list[LayerRange], args: argparse.Namespace
) -> dict[str, object]:
    sessions_max = max(args.sessions)
    config = LlamaConfig(n_threads=1, max_slots=sessions_max, n_ctx_per_slot=512, max_batch_tokens=64)
    layouts = open_layout(model, cache, ranges, config)
    results = []
    for sessions in args.sessions:
        for pattern in patterns(sessions):
            row = measure_pattern(layouts, pattern, sessions, args.rounds, args.warmup)
            results.append({"sessions": sessions, **row})
            print(name, sessions, _line(row), flush=True)
    for shards in layouts.values():
        for backend in shards.backends:
            backend.close()
    return {"layout": name, "ranges": [[r.start, r.stop] for r in ranges], "results": results}


def _line(row: dict[str, object]) -> str:
    cells = []
    for name in VARIANTS:
        shards = cast(list[dict[str, float]], row[name])
        cells.append(
            f"{name}: " + " | ".join(f"{s['ms_per_row_median']:.3f} ({s['graphs_reused']} reused)" for s in shards)
        )
    return f"{row['pattern']:<32} " + "  ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("/work/main/.data/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--cache", type=Path, default=Path("/work/main/.data/cache"), help="slice cache root")
    parser.add_argument("--sessions", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--rounds", type=int, default=40, help="measured rounds per pattern (positions stay < 256)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--layouts", nargs="+", default=["split", "whole"], choices=["split", "whole"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if PROMPT_TOKENS + args.warmup + args.rounds > 256:
        parser.error("keep every position under 256, so the KV view (n_kv) never changes size")
    cache = SliceCache(args.cache)
    n_layers = describe_model(args.model).n_layers
    layouts = {"split": decode_work(args.model).split(2), "whole": [LayerRange(0, n_layers)]}
    started = time.time()
    load_before = os.getloadavg()
    report = {
        "what": "engine-thread CPU ms per decoded row by wave pattern and engine variant (VARIANTS), 1 thread",
        "model": args.model.name,
        "host": platform.node(),
        "load_before": [round(x, 2) for x in load_before],
        "variants": {
            name: {"graph_reuse": r, "split_small_decode_batches": w, "lm_head_batch_from": b}
            for name, (r, w, b) in VARIANTS.items()
        },
        "rounds": args.rounds,
        "warmup": args.warmup,
        "layouts": [run_layout(name, args.model, cache, layouts[name], args) for name in args.layouts],
    }
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    report["seconds"] = round(time.time() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
