"""Every certified family splits bit-identically on the pinned llama.cpp, in process.

Grid: llama, qwen2, qwen3, qwen3moe, gemma3 x {f32, q8_0, q4_0, q4_k} x three or four cut
patterns each (gemma3: on and off its window period, and its global layer alone in a slice).
Per cell: prefill logits of every row 0.0 apart, 32 greedy tokens identical, and 8 sessions
decoded in one batch each identical to the whole model decoding it alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from engine_routes import batched_step, greedy
from family_models import FamilyRoutes, OpenModel, grid, n_vocab_of, prompt_for

from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.engine.bitwise import bit_identical
from meshnet.engine.llama_config import LlamaConfig

SLOTS = 8
CONFIG = LlamaConfig(n_threads=1, max_slots=SLOTS, n_ctx_per_slot=128, max_batch_tokens=32)
GRID = grid()
IDS = [f"{family}-{quant}-{cut.replace(' ', '_')}" for family, quant, cut in GRID]


@pytest.fixture(scope="module")
def family_routes(
    synthetic_model_factory: Callable[[SyntheticSpec], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FamilyRoutes]:
    holder = FamilyRoutes(synthetic_model_factory, tmp_path_factory.mktemp("family-cache"), CONFIG)
    yield holder
    holder.close()


@pytest.fixture
def model(request: pytest.FixtureRequest, family_routes: FamilyRoutes) -> Iterator[OpenModel]:
    family, quant, _ = request.node.callspec.params["cell"]
    yield family_routes.get(family, quant)
    family_routes.release(SLOTS)


@pytest.mark.parametrize("cell", GRID, ids=IDS)
def test_prefill_logits_are_bit_identical(model: OpenModel, cell: tuple[str, str, str]) -> None:
    family, _, cut = cell
    n_vocab = n_vocab_of(model.whole)
    for seed, length in ((0, 9), (1, 45)):  # 45 tokens: two prefill chunks, far past the window
        tokens = prompt_for(family, n_vocab, length, seed)
        expected = model.whole.forward(0, 0, tokens, "all")
        assert np.isfinite(expected).all() and not np.array_equal(expected[0], expected[-1])
        assert bit_identical(model.splits[cut].forward(0, 0, tokens, "all"), expected)
        model.whole.release(0)
        model.splits[cut].release(0)


@pytest.mark.parametrize("cell", GRID, ids=IDS)
def test_32_greedy_tokens_are_identical(model: OpenModel, cell: tuple[str, str, str]) -> None:
    family, _, cut = cell
    tokens = prompt_for(family, n_vocab_of(model.whole), 12, 2)
    expected = greedy(model.whole, tokens, 32)
    actual = greedy(model.splits[cut], tokens, 32, slot=1)
    assert actual.tokens == expected.tokens
    assert bit_identical(actual.logits, expected.logits)
    assert not np.array_equal(expected.logits[0], expected.logits[-1])  # the state really moves


# One-token steps of 8 sessions in one run equal each session's solo step in every cell: where
# the CPU kernels would round a batched row differently (K-quants, F32 matrices, experts) the
# backend runs each step in a call of its own (engine/batching.py). A split must reproduce the
# whole model's batched step exactly too.


@pytest.mark.parametrize("cell", GRID, ids=IDS)
def test_8_batched_sessions_match_the_whole_model(model: OpenModel, cell: tuple[str, str, str]) -> None:
    family, _quant, cut = cell
    split, whole = model.splits[cut], model.whole
    n_vocab = n_vocab_of(whole)
    prompts = [prompt_for(family, n_vocab, 3 + 2 * slot, 10 + slot) for slot in range(SLOTS)]
    solo = {slot: greedy(whole, tokens, 5, slot=slot).logits for slot, tokens in enumerate(prompts)}
    last = {}
    for slot, tokens in enumerate(prompts):
        whole.forward(slot, 0, tokens)
        last[slot] = split.forward(slot, 0, tokens)[-1]
    for step in range(4):
        steps = [(slot, len(prompts[slot]) + step, np.array([int(np.argmax(last[slot]))], np.int32)) for slot in last]
        batched, expected = batched_step(split, steps), batched_step(whole, steps)
        for slot in last:
            assert bit_identical(batched[slot], expected[slot]), f"session {slot} vs the whole model batched"
            assert bit_identical(batched[slot][-1], solo[slot][step + 1]), f"session {slot} vs solo"
            last[slot] = batched[slot][-1]
