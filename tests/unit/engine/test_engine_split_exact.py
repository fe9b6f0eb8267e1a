"""Split execution is bit-identical to the whole model on synthetic models: prefill logits of
every row and 32 greedy steps, through 2 and 3 in-process shards, chunked prefill included."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from engine_routes import GreedyRun, greedy, open_routes, prompt, release_all
from gguf import GGMLQuantizationType as Quant

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.layers import LayerRange, split_evenly
from meshnet.engine.bitwise import bit_identical, describe_difference
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute

MODELS = {
    "4L-tied-q4_1": SyntheticSpec(n_layers=4),
    "6L-untied-q8_0": SyntheticSpec(n_layers=6, weight_type=Quant.Q8_0, tied_embeddings=False, seed=1),
}
PROMPTS = {
    "one token": prompt(1, 0),
    "short": prompt(8, 1),
    "crosses a chunk edge": prompt(40, 2),
    "100 tokens, 4 chunks": prompt(100, 3),  # max_batch_tokens is 32: prefill runs in chunks
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def routes(
    request: pytest.FixtureRequest,
    synthetic_model_factory: Callable[[SyntheticSpec], Path],
    small_llama_config: LlamaConfig,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, LocalRoute]]:
    n_layers = MODELS[request.param].n_layers
    source = synthetic_model_factory(MODELS[request.param])
    layouts = {
        "whole": [LayerRange(0, n_layers)],
        "2 shards": split_evenly(n_layers, 2),
        "3 shards": split_evenly(n_layers, 3),
        "3 uneven shards": [LayerRange(0, 1), LayerRange(1, n_layers - 1), LayerRange(n_layers - 1, n_layers)],
    }
    cache = SliceCache(tmp_path_factory.mktemp("engine-cache"))
    with open_routes(source, cache, small_llama_config, layouts) as opened:
        yield opened


@pytest.fixture(autouse=True)
def _free_slots(routes: dict[str, LocalRoute], small_llama_config: LlamaConfig) -> Iterator[None]:
    yield
    release_all(routes, small_llama_config.max_slots)


SPLITS = ["2 shards", "3 shards", "3 uneven shards"]


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_prefill_logits_of_every_row_are_bit_identical(routes: dict[str, LocalRoute], name: str) -> None:
    tokens = PROMPTS[name]
    expected = routes["whole"].forward(0, 0, tokens, "all")
    assert expected.shape == (len(tokens), 293) and expected.dtype == np.float32
    assert np.isfinite(expected).all()
    if len(tokens) > 1:
        assert not np.array_equal(expected[0], expected[-1])  # rows really differ: nothing degenerate
    for split in SPLITS:
        actual = routes[split].forward(0, 0, tokens, "all")
        assert bit_identical(actual, expected), f"{split}: prefill logits {describe_difference(expected, actual)}"


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_32_greedy_tokens_and_their_logits_are_identical(routes: dict[str, LocalRoute], name: str) -> None:
    expected: GreedyRun = greedy(routes["whole"], PROMPTS[name], 32)
    assert len(expected.tokens) == 32
    assert expected.tokens == [int(np.argmax(row)) for row in expected.logits]
    for split in SPLITS:
        actual = greedy(routes[split], PROMPTS[name], 32, slot=1)
        assert actual.tokens == expected.tokens, split
        assert bit_identical(actual.logits, expected.logits), split


def test_different_prompts_give_different_continuations(routes: dict[str, LocalRoute]) -> None:
    # The exactness checks above would pass vacuously if the model ignored its input.
    runs = [greedy(routes["3 shards"], PROMPTS[name], 8) for name in ("short", "100 tokens, 4 chunks")]
    assert not np.array_equal(runs[0].logits, runs[1].logits)


def test_a_different_model_is_detected(
    routes: dict[str, LocalRoute],
    synthetic_model_factory: Callable[[SyntheticSpec], Path],
    small_llama_config: LlamaConfig,
    tmp_path: Path,
) -> None:
    # Sensitivity of the comparison: the same shape of model with other weights must differ.
    n_layers = routes["whole"].backends[0].shape.n_layers
    other = synthetic_model_factory(SyntheticSpec(n_layers=n_layers, seed=77))
    with open_routes(other, SliceCache(tmp_path), small_llama_config, {"x": split_evenly(n_layers, 2)}) as opened:
        theirs = opened["x"].forward(0, 0, PROMPTS["short"], "all")
    ours = routes["whole"].forward(0, 0, PROMPTS["short"], "all")
    assert float(np.abs(theirs - ours).max()) > 0.0


def test_last_row_mode_returns_one_row_identical_across_routes(routes: dict[str, LocalRoute]) -> None:
    tokens = PROMPTS["crosses a chunk edge"]
    expected = routes["whole"].forward(2, 0, tokens, "last")
    assert expected.shape == (1, 293)
    for split in SPLITS:
        assert bit_identical(routes[split].forward(2, 0, tokens, "last"), expected), split
