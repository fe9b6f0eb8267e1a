"""Lanes outside the main sweep, each judged as a ratio to its own whole-model run.

- ``synthetic-1b``: a TinyLlama-1.1B-shaped random-weight model (22 layers, n_embd 2048, Q4_0
  blocks, Q8_0 token table), written once by the synthetic writer into the data dir. Per-token
  compute is ~10x SmolLM2's: the regime of the models users actually split. It runs the same
  lanes machinery (llama-whole and meshnet-3, drift checked) on a short workload.
- ``llama-rpc-3``: llama.cpp's own RPC (``bench.llama_rpc``).
- ``transformers``: the design documents' baseline (``bench.transformers_lane``), reported as
  ``transformers-whole`` and ``transformers-recompute-N``; skipped with the reason without the
  ``baseline`` extra.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic_models import SYNTHETIC_1B, provision_synthetic
from meshnet.bench.config import BenchConfig
from meshnet.bench.lanes import measure_lanes
from meshnet.bench.llama_rpc import measure_llama_rpc
from meshnet.bench.results import ExtraLane, LaneResult
from meshnet.bench.runner import LaneSet, Progress
from meshnet.bench.transformers_lane import measure_transformers
from meshnet.core.errors import MeshnetError

SYNTHETIC_PROMPT_TOKENS = 32
SYNTHETIC_OUTPUT_TOKENS = 16


async def measure_extra_lanes(config: BenchConfig, progress: Progress) -> dict[str, ExtraLane]:
    lanes: dict[str, ExtraLane] = {}
    for name in config.extra_lanes:
        if name == "synthetic-1b":
            lanes[name] = await measure_synthetic(config, progress)
        elif name == "llama-rpc-3":
            lanes[name] = await asyncio.to_thread(measure_llama_rpc, config, progress)
        elif name == "transformers":
            lanes.update(await asyncio.to_thread(measure_transformers, config, progress))
        else:
            lanes[name] = ExtraLane(None, None, None, None, "", skipped=f"unknown extra lane {name!r}")
    return lanes


def synthetic_model(data_dir: Path) -> Path:
    """The synthetic-1b GGUF in the data dir, written on first use (~0.7 GB)."""
    return provision_synthetic(data_dir / "models", SYNTHETIC_1B)


async def measure_synthetic(config: BenchConfig, progress: Progress) -> ExtraLane:
    progress("synthetic-1b: preparing the model (written once into the data dir)")
    path = await asyncio.to_thread(synthetic_model, config.data_dir)
    description = describe_model(path)
    sub = replace(
        config,
        model=path,
        lanes=("llama-whole", "meshnet-3"),
        concurrency=(1,),
        sweep_lanes=("llama-whole", "meshnet-3"),
        lane_concurrency=(1,),
        repetitions=2,
        prompt_tokens=SYNTHETIC_PROMPT_TOKENS,
        output_tokens=SYNTHETIC_OUTPUT_TOKENS,
        contexts=(),
        max_slots=1,
        n_ctx_per_slot=256,
    )
    # The writer's vocabulary has no text to speak of: fixed in-vocabulary ids make the prompt.
    prompt = tuple(3 + (7 * index) % 200 for index in range(SYNTHETIC_PROMPT_TOKENS))
    try:
        results, _, _ = await measure_lanes(
            LaneSet(sub, SliceCache(config.data_dir / "cache"), description, progress), (prompt,), time.monotonic()
        )
    except MeshnetError as error:
        return ExtraLane(None, None, None, None, "", skipped=f"{error.code}: {error.message}")
    return _ratio_lane(results.get("meshnet-3"), results.get("llama-whole"), description.path.name)


def _ratio_lane(route: LaneResult | None, whole: LaneResult | None, model: str) -> ExtraLane:
    route_run = route.at(1) if route is not None else None
    whole_run = whole.at(1) if whole is not None else None
    decode = route_run.decode_tok_s if route_run is not None else None
    reference = whole_run.decode_tok_s if whole_run is not None else None
    agreement = route.drift.token_agreement if route is not None else None
    return ExtraLane(
        decode_tok_s=decode,
        whole_decode_tok_s=reference,
        vs_whole=decode / reference if decode and reference else None,
        token_agreement=agreement,
        note=f"meshnet-3 vs llama-whole on {model}, 1 stream, "
        f"{SYNTHETIC_PROMPT_TOKENS}-token prompt, {SYNTHETIC_OUTPUT_TOKENS} tokens",
    )
