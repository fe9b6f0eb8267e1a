"""The ``gemma3`` lane set: the real second model, Gemma 3 270M Q4_K_M, whole-model llama.cpp
against a route of three worker processes (``meshnet-3``), decode and prefill.

The route is the bench's even split (0:6, 6:12, 12:18 of 18 layers); cuts off the window
period are covered by the model tests. Context scaling and the concurrency sweep stay with the
default model's run: this lane set answers "does the second family cost what the first does", so
it runs one stream at a time, short.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from meshnet.artifact.provision import GEMMA3_270M, model_path
from meshnet.bench.config import BenchConfig
from meshnet.core.errors import FailedPrecondition

LANES = ("llama-whole", "meshnet-3")


def gemma3_config(config: BenchConfig, data_dir: Path) -> BenchConfig:
    """``config`` turned into the gemma3 lane set (flags given with ``--gemma3`` still apply)."""
    model = model_path(data_dir / "models", GEMMA3_270M)
    if not model.exists():
        raise FailedPrecondition(f"{model} is missing: run `meshnet provision gemma3-270m` first")
    return replace(
        config,
        model=model,
        gemma3=True,
        lanes=LANES,
        sweep_lanes=LANES,
        concurrency=(1,),
        lane_concurrency=(1,),
        prompt_tokens=128,
        output_tokens=48,
        repetitions=2,
        contexts=(),
        prefill_prompt_tokens=0,  # the prefill phase is issue 15's SmolLM2 figure
        time_budget_s=600.0,
    )
