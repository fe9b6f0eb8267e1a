"""SmolLM2-135M-Instruct with a quantized KV (``--kv-type q8_0|q4_0``): 3 shards equal the whole
model bit for bit (a 300-token prompt's last-row logits and 32 greedy steps), and the KV llama.cpp
stores per layer and position is what the memory model counts (SmolLM2: 384 values a position).

Needs the provisioned model and MESHNET_ENABLE_REAL_INFERENCE_TESTS=1.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "engine"))

from engine_routes import greedy, open_routes
from smollm2_model import ENABLED_MARK, MODEL, PROVISIONED_MARK

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.footprint import memory_footprint
from meshnet.core.kv_type import KvType
from meshnet.core.layer_costs import kv_bytes_per_layer
from meshnet.core.layers import LayerRange
from meshnet.engine.bitwise import bit_identical, describe_difference
from meshnet.engine.certification import certify_llama_engine
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.tokenizer import Tokenizer

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.timeout(300),
    ENABLED_MARK,
    PROVISIONED_MARK,
]

LAYOUTS = {
    "whole": [LayerRange(0, 30)],
    "3 shards": [LayerRange(0, 10), LayerRange(10, 20), LayerRange(20, 30)],
}
TEXT = "The harbour master counted the ships at dawn and wrote each name in the ledger. " * 20


@pytest.mark.parametrize("kv_type", [KvType.Q8_0, KvType.Q4_0], ids=str)
def test_smollm2_with_a_quantized_kv_split_3_ways_equals_the_whole_model(kv_type: KvType, tmp_path: Path) -> None:
    certify_llama_engine(model=MODEL, kv_type=kv_type)  # what a worker runs first
    config = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=1024, max_batch_tokens=64, kv_type=kv_type)
    tokens = np.array(Tokenizer(describe_model(MODEL)).encode(TEXT, add_special=True)[:300], np.int32)
    with open_routes(MODEL, SliceCache(tmp_path / "cache"), config, LAYOUTS) as routes:
        want, got = greedy(routes["whole"], tokens, 32), greedy(routes["3 shards"], tokens, 32)
        shard = routes["3 shards"].backends[1]
        routes["3 shards"].forward(0, 0, tokens[:256])
        size = len(shard.export_slot(0))
    assert got.tokens == want.tokens
    assert bit_identical(want.logits, got.logits), describe_difference(want.logits, got.logits)
    counted = 10 * kv_bytes_per_layer(memory_footprint(MODEL), 256, kv_type)
    assert counted <= size <= counted * 1.01, f"llama.cpp stores {size} bytes, the model counts {counted}"
