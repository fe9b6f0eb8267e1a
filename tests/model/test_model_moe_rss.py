"""A qwen3moe shard's resident memory follows the experts of its own layers.

Each range of a 104 MB synthetic MoE model (8 layers x 32 experts, Q8_0) is loaded in a fresh
process, one prefill is run, and the RSS growth is set against the tensor bytes its slice owns.
Measured on the 2-core dev machine: growth = owned + 7-10 MB (context and compute buffers) for
every range, e.g. 0:8 112 MB for 104 MB owned, 0:4 59 MB for 52 MB, 6:8 36 MB for 26 MB.
Runs with the real-inference tests (MESHNET_ENABLE_REAL_INFERENCE_TESTS=1): it spawns processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Quant

from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model

pytestmark = pytest.mark.skipif(
    os.environ.get("MESHNET_ENABLE_REAL_INFERENCE_TESTS") != "1",
    reason="set MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 to run process-level measurements",
)

SPEC = SyntheticSpec(
    architecture="qwen3moe",
    n_layers=8,
    n_embd=256,
    n_ff=256,
    n_expert=32,
    n_expert_used=4,
    n_ff_expert=512,
    weight_type=Quant.Q8_0,
)
_SHARD = r"""
import json, sys
from pathlib import Path
import numpy as np, psutil
from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.gguf_file import parse_gguf
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.shards import open_llama_shard

source, start, stop, cache = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), SliceCache(Path(sys.argv[4]))
layers = LayerRange(start, stop)
files = cache.shard_files(source, layers, 8)  # cut first: only loading and running is measured
owned = sum(t.nbytes for t in parse_gguf(files.slice).tensors.values())
before = psutil.Process().memory_info().rss
config = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=256, max_batch_tokens=64)
backend = open_llama_shard(describe_model(source), layers, cache, config)
if backend.shape.takes_tokens:
    step = StepInput(0, 0, tokens=np.arange(10, 74, dtype=np.int32))
else:
    step = StepInput(0, 0, hidden=np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32))
backend.run([step])
print(json.dumps({"owned": owned, "growth": psutil.Process().memory_info().rss - before}))
"""


def _measure(source: Path, start: int, stop: int, cache: Path) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", _SHARD, str(source), str(start), str(stop), str(cache)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_shard_memory_follows_its_own_experts(tmp_path: Path) -> None:
    source = write_synthetic_model(tmp_path / "moe.gguf", SPEC)
    mib = 1 << 20
    results = {(a, b): _measure(source, a, b, tmp_path / "cache") for a, b in ((0, 8), (0, 4), (4, 8), (6, 8))}
    for (a, b), result in results.items():
        owned, growth = result["owned"], result["growth"]
        print(f"layers {a}:{b}: owned {owned / mib:.1f} MiB, RSS growth {growth / mib:.1f} MiB")
        assert 0.9 * owned <= growth <= owned + 32 * mib, (a, b)  # resident: its own experts, not others'
    assert results[(0, 4)]["growth"] < 0.65 * results[(0, 8)]["growth"]
