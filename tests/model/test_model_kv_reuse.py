"""Real models: a split route's KV exported at a prefill-chunk boundary and imported into another
slot continues bit-identically to the whole model's cold run (issue 31).

SmolLM2-135M (Q4_1) and Gemma 3 270M (Q4_K_M), each cut in three; Gemma's boundary (768) lies
past its 512-position window, so the windowed layers' restored cache is the window as it stood.

Needs MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 and both models provisioned under
$MESHNET_DATA_DIR/models (``make test`` does both).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gemma3_model import DATA_DIR, ENABLED
from gemma3_model import MODEL as GEMMA3

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.provision import model_path
from meshnet.core.layers import LayerRange
from meshnet.engine.bitwise import bit_identical, describe_difference
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard

SMOLLM2 = model_path(DATA_DIR / "models")
CHUNK = 256
CONFIG = LlamaConfig(n_threads=2, max_slots=2, n_ctx_per_slot=1024, max_batch_tokens=CHUNK)
CASES = {
    # name: (model, cut, boundary, prompt length)
    "smollm2": (SMOLLM2, ((0, 10), (10, 20), (20, 30)), 2 * CHUNK, 2 * CHUNK + 180),
    "gemma3 past its window": (GEMMA3, ((0, 7), (7, 13), (13, 18)), 3 * CHUNK, 3 * CHUNK + 130),
}
DECODE = 4

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(not ENABLED, reason="set MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 to run real-model tests"),
]


@pytest.mark.parametrize("case", list(CASES))
def test_a_restored_prefix_continues_like_the_cold_whole_model(case: str, tmp_path: Path) -> None:
    model, cut, boundary, length = CASES[case]
    if not model.exists():
        pytest.skip(f"{model} is not provisioned")
    source = describe_model(model)
    cache = SliceCache(tmp_path)
    tokens = np.concatenate([[2], np.random.default_rng(31).integers(300, 40000, length - 1)]).astype(np.int32)
    whole = LocalRoute([open_llama_shard(source, LayerRange(0, source.n_layers), cache, CONFIG)])
    try:
        expected = [whole.forward(0, 0, tokens)[-1]]
        for step in range(DECODE):
            token = np.array([int(np.argmax(expected[-1]))], np.int32)
            expected.append(whole.forward(0, length + step, token)[-1])
    finally:
        whole.close()
    split = LocalRoute([open_llama_shard(source, LayerRange(a, b), cache, CONFIG) for a, b in cut])
    try:
        split.forward(0, 0, tokens[:boundary])
        blobs = [backend.export_slot(0) for backend in split.backends]
        split.release(0)
        for backend, blob in zip(split.backends, blobs, strict=True):
            backend.import_slot(1, blob, boundary)
        actual = [split.forward(1, boundary, tokens[boundary:])[-1]]
        for step in range(DECODE):
            actual.append(split.forward(1, length + step, np.array([int(np.argmax(actual[-1]))], np.int32))[-1])
    finally:
        split.close()
    for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert bit_identical(got, want), f"row {index}: {describe_difference(want, got)}"
