"""Gemma 3 270M (Q4_K_M) on llama.cpp: split routes against the whole model, in process.

The second real model and the first with index-dependent layers: every sixth layer attends
globally, the rest through a 512-position window. The cuts 9 and 7/13 fall off that period, so
they pass only because each slice carries its own layers' window flags (``architectures/gemma3``).
It is a base model without a chat template: prompts are plain completions.

Needs MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 and ``meshnet provision gemma3-270m`` under
$MESHNET_DATA_DIR/models (default .data/models); ``make test`` does both.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from gemma3_model import MARKS, MODEL, open_tokenizer

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.generation import GenerationRequest
from meshnet.core.layers import LayerRange
from meshnet.engine.bitwise import bit_identical
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard
from meshnet.engine.tokenizer import Tokenizer

pytestmark = MARKS

LAYOUTS = {
    "whole": [LayerRange(0, 18)],
    "2 shards, cut off the period": [LayerRange(0, 9), LayerRange(9, 18)],
    "3 shards, cuts off the period": [LayerRange(0, 7), LayerRange(7, 13), LayerRange(13, 18)],
}
SPLITS = [name for name in LAYOUTS if name != "whole"]
CONFIG = LlamaConfig(n_threads=2, max_slots=1, n_ctx_per_slot=1024, max_batch_tokens=256)
GREEDY_STEPS = 64
PASSAGE = (
    "The lighthouse stood on a narrow spit of rock at the mouth of the harbour, and for more than a "
    "century its keepers climbed the iron stairs each evening to light the lamp. In the early years "
    "the light came from whale oil, later from paraffin, and at last from a single electric bulb. "
)
PROMPTS = {
    "capital": "The capital of France is",
    "code": 'def sum_of_squares(numbers):\n    """Return the sum of the squares of numbers."""\n',
    # About 600 tokens: longer than the 512-position window, so windowed layers really drop keys.
    "long document": PASSAGE * 10 + "\nIn one sentence, the lighthouse",
}


tokenizer = pytest.fixture(scope="module")(open_tokenizer)


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LocalRoute]]:
    cache = SliceCache(tmp_path_factory.mktemp("gemma3-slices"))
    opened: dict[str, LocalRoute] = {}
    try:
        for name, ranges in LAYOUTS.items():
            opened[name] = LocalRoute([open_llama_shard(describe_model(MODEL), r, cache, CONFIG) for r in ranges])
        yield opened
    finally:
        for route in opened.values():
            route.close()


def _tokens(tokenizer: Tokenizer, name: str) -> np.ndarray:
    return np.array(tokenizer.encode(PROMPTS[name], add_special=True), np.int32)


def test_the_long_prompt_outruns_the_window(tokenizer: Tokenizer) -> None:
    assert len(_tokens(tokenizer, "long document")) > 512


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_prefill_logits_are_bit_identical(routes: dict[str, LocalRoute], tokenizer: Tokenizer, name: str) -> None:
    tokens = _tokens(tokenizer, name)
    # Every row for the short prompts; the last row for the long one (a row is 262144 logits).
    rows = "all" if len(tokens) < 64 else "last"
    expected = routes["whole"].forward(0, 0, tokens, rows)
    routes["whole"].release(0)
    assert np.isfinite(expected).all()
    for split in SPLITS:
        actual = routes[split].forward(0, 0, tokens, rows)
        routes[split].release(0)
        assert bit_identical(actual, expected), split


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_64_greedy_tokens_are_identical(routes: dict[str, LocalRoute], tokenizer: Tokenizer, name: str) -> None:
    request = GenerationRequest(tuple(int(t) for t in _tokens(tokenizer, name)), GREEDY_STEPS)
    expected = list(routes["whole"].generate(request))
    assert len(expected) == GREEDY_STEPS
    for split in SPLITS:
        assert list(routes[split].generate(request)) == expected, split
    if name == "capital":
        assert "France" in tokenizer.decode(expected)  # the real model, not noise
