"""A 32,768-token prompt on a synthetic model trained for 32,768 positions (tiny width, so the
test stays short on 2 cores): split 3 ways, its prefill and greedy decode equal the whole model's
bit for bit, and each shard's KV (llama.cpp's per-sequence state of the session) is proportional
to the layers it owns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine_routes import open_routes, prompt

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.footprint import memory_footprint
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.layer_costs import kv_bytes_per_layer
from meshnet.core.layers import LayerRange
from meshnet.engine.bitwise import bit_identical, describe_difference
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute

pytestmark = pytest.mark.timeout(600)

LONG = 32_768
SPEC = SyntheticSpec(n_layers=4, n_embd=64, n_head=2, n_head_kv=1, head_dim=32, n_ff=64, n_ctx_train=2 * LONG)
"""Trained for more than the prompt, so a session holds the prompt and the tokens decoded after it."""
SHARDS = [LayerRange(0, 1), LayerRange(1, 3), LayerRange(3, 4)]
"""1, 2 and 1 layers: the middle shard's KV must be twice either end's."""
STEPS = 4


def test_a_32k_prompt_split_3_ways_equals_the_whole_model_with_kv_proportional_to_layers(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path / "long-context.gguf", SPEC)
    # Room for the prompt and the decoded tokens; prefill in calls of 512 rows (bounded scratch).
    config = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=LONG + STEPS, max_batch_tokens=512)
    layouts = {"whole": [LayerRange(0, SPEC.n_layers)], "3 shards": SHARDS}
    tokens = prompt(LONG, 32)
    with open_routes(model, SliceCache(tmp_path / "cache"), config, layouts) as routes:
        runs = {name: _greedy(route, tokens) for name, route in routes.items()}
        sizes = [len(backend.export_slot(0)) for backend in routes["3 shards"].backends]
    want, got = runs["whole"], runs["3 shards"]
    assert got[0] == want[0], "greedy tokens after the 32K prompt differ"
    assert bit_identical(want[1], got[1]), describe_difference(want[1], got[1])
    # Each shard's KV for the session: its layers' share as the memory model counts it, plus
    # llama.cpp's few bytes of cell bookkeeping a position (the same on every shard).
    positions = LONG + STEPS - 1
    per_layer = kv_bytes_per_layer(memory_footprint(model), positions)
    assert sizes[1] - sizes[0] == pytest.approx(per_layer, rel=1e-4)  # 2 layers against 1
    assert sizes[2] == sizes[0]
    bookkeeping = sizes[0] - per_layer
    assert 0 <= bookkeeping <= 16 * positions, f"{bookkeeping / positions:.1f} bytes a position besides the KV"


def _greedy(route: LocalRoute, tokens: np.ndarray) -> tuple[list[int], np.ndarray]:
    """Prefill ``tokens`` (logits of the last row), then ``STEPS - 1`` greedy steps on that KV."""
    logits = route.forward(0, 0, tokens, "last")
    rows, chosen = [], []
    for step in range(STEPS):
        if logits is None:
            raise AssertionError("the tail returned no logits")
        rows.append(logits[-1])
        chosen.append(int(np.argmax(logits[-1])))
        if step < STEPS - 1:
            logits = route.forward(0, len(tokens) + step, np.array([chosen[-1]], np.int32))
    return chosen, np.stack(rows)
