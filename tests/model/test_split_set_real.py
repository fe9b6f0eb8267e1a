"""SmolLM2-135M-Instruct (Q4_1) written as a 3-part gguf-split set: slices cut from the set are
the unsplit file's, and the set split 3 ways decodes what the unsplit whole model decodes.

Needs the provisioned model and MESHNET_ENABLE_REAL_INFERENCE_TESTS=1.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "engine"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "artifact"))
from artifact_split import write_split_set
from engine_routes import greedy
from smollm2_model import ENABLED_MARK, MODEL, PROVISIONED_MARK

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.gguf_split import model_sha256, open_model
from meshnet.artifact.hashing import file_sha256
from meshnet.artifact.slicing import write_slice
from meshnet.core.layers import LayerRange
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard
from meshnet.engine.tokenizer import Tokenizer

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.timeout(300),
    ENABLED_MARK,
    PROVISIONED_MARK,
]

RANGES = (LayerRange(0, 10), LayerRange(10, 20), LayerRange(20, 30))
CONFIG = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=512, max_batch_tokens=128)
STEPS = 32


def _route(source: Path, ranges: tuple[LayerRange, ...], cache: SliceCache) -> LocalRoute:
    description = describe_model(source)
    return LocalRoute([open_llama_shard(description, layers, cache, CONFIG) for layers in ranges])


def test_smollm2_as_a_split_set_equals_the_unsplit_file(tmp_path: Path) -> None:
    parts = write_split_set(MODEL, tmp_path / "set", max_tensors=100, stem="SmolLM2-135M-Instruct")
    assert len(parts) == 3  # 272 tensors
    claimed = file_sha256(MODEL)
    for layers in RANGES:
        from_file, from_set = tmp_path / f"file-{layers.start}.gguf", tmp_path / f"set-{layers.start}.gguf"
        write_slice(MODEL, layers, from_file, source_sha256=claimed)
        write_slice(parts[0], layers, from_set, source_sha256=claimed)
        assert from_set.read_bytes() == from_file.read_bytes(), str(layers)
        from_file.unlink()
        from_set.unlink()
    assert model_sha256(open_model(parts[0])) != claimed
    tokenizer = Tokenizer(describe_model(parts[0].parent))
    try:
        prompt = tokenizer.encode_chat([{"role": "user", "content": "Tell me a very short story about a cat."}])
    finally:
        tokenizer.close()
    whole = _route(MODEL, (LayerRange(0, 30),), SliceCache(tmp_path / "file-cache"))
    try:
        expected = greedy(whole, np.asarray(prompt), STEPS).tokens
    finally:
        whole.close()
    split = _route(parts[0].parent, RANGES, SliceCache(tmp_path / "set-cache"))
    try:
        assert greedy(split, np.asarray(prompt), STEPS).tokens == expected
    finally:
        split.close()
