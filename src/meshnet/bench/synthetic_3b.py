"""The ``synthetic-3b`` lane set: a random-weight Llama-3.2-3B-shaped Q4_0 model (1.9 GB, written
into the data dir on first use, ``artifact.synthetic_models``), single stream: whole-model
llama.cpp against routes of two and three worker processes (``meshnet-2``, ``meshnet-3``), drift
checked against whole, and llama.cpp's own RPC on the same model (``llama-rpc-3``).

It answers issue 34's "the size users split": per-token compute ~20x SmolLM2's, so a seam's fixed
cost is a small share and the ratio shows what a split costs where compute dominates. Only one
stream and no context or prefill phase (those stay with the default model's run). Its outputs are
token ids of random weights, not text; the drift check still compares them id for id.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from meshnet.artifact.synthetic_models import SYNTHETIC_3B, provision_synthetic
from meshnet.bench.config import BenchConfig

LANES = ("llama-whole", "meshnet-2", "meshnet-3")
EXTRA_LANES = ("llama-rpc-3",)


def synthetic_3b_config(config: BenchConfig, data_dir: Path) -> BenchConfig:
    """``config`` turned into the synthetic-3b lane set (flags given with ``--synthetic-3b`` still
    apply); writes the model first when the data dir lacks it (~15 s)."""
    return replace(
        config,
        model=provision_synthetic(data_dir / "models", SYNTHETIC_3B),
        synthetic_3b=True,
        lanes=LANES,
        sweep_lanes=LANES,
        concurrency=(1,),
        lane_concurrency=(1,),
        top_concurrency_lanes=(),
        extra_lanes=EXTRA_LANES,
        prompt_tokens=64,
        output_tokens=32,
        repetitions=2,
        max_slots=1,  # one stream: a 1-slot KV (56 MB at 512 positions) instead of 8 x 2048's 1.9 GB
        n_ctx_per_slot=512,
        contexts=(),
        prefill_prompt_tokens=0,  # prefill is issue 15's SmolLM2 figure
        time_budget_s=600.0,
    )
