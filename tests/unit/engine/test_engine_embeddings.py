"""Embeddings of a split equal whole-model llama.cpp's bit for bit.

The oracle is llama-cpp-python's own ``Llama(..., embedding=True, pooling_type=LAST).embed``
on the whole GGUF (its graph pools ``result_norm`` in C); the split under test is an in-process
chain of range slices whose tail hands back its final-norm rows (``StepOutput.normed``) and
``engine.pooling`` pools them. Prompts within one prefill chunk and across two are compared,
normalized and raw; mean pooling is refused (see ``core.embedding``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.embedding import EmbeddingSpec, pooling_kind
from meshnet.core.errors import EngineError, InvalidArgument
from meshnet.engine.backend import StepInput
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.pooling import pool
from meshnet.engine.shards import open_local_route

SHORT = "the house and a dog"
LONG = "the house and a dog ran to the big tree by the river and back"


@pytest.fixture(scope="module")
def oracle(tiny_model: Path, small_llama_config: LlamaConfig) -> Iterator[llama_cpp.Llama]:
    config = small_llama_config
    llm = llama_cpp.Llama(
        str(tiny_model),
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_LAST,
        n_ctx=config.n_ctx_per_slot,
        n_batch=config.n_ctx_per_slot,
        n_ubatch=config.max_batch_tokens,  # chunks the prompt as the shards do
        n_threads=config.n_threads,
        flash_attn=config.flash_attn,
        verbose=False,
    )
    yield llm
    llm.close()


@pytest.fixture(scope="module", params=[1, 3], ids=["whole", "three"])
def route(
    request: pytest.FixtureRequest,
    tiny_model: Path,
    small_llama_config: LlamaConfig,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LocalRoute]:
    cache = SliceCache(tmp_path_factory.mktemp("cache"))
    opened = open_local_route(describe_model(tiny_model), request.param, cache, small_llama_config)
    yield opened
    opened.close()


@pytest.mark.parametrize("text", [SHORT, LONG], ids=["one-chunk", "two-chunks"])
@pytest.mark.parametrize("normalize", [True, False])
def test_split_embedding_equals_llama_cpp_bit_for_bit(
    route: LocalRoute, oracle: llama_cpp.Llama, text: str, normalize: bool, small_llama_config: LlamaConfig
) -> None:
    tokens = oracle.tokenize(text.encode())
    if text == LONG:
        assert len(tokens) > small_llama_config.max_batch_tokens  # really two prefill chunks
    expected = np.array(oracle.embed(text, normalize=normalize), dtype=np.float64)
    got = route.embed(tokens, EmbeddingSpec(normalize=normalize))
    assert got.dtype == np.float64 and got.shape == expected.shape
    assert np.array_equal(got, expected)
    if normalize:
        assert np.linalg.norm(got) == pytest.approx(1.0)


def test_embedding_releases_the_slot_so_a_second_call_is_the_same(route: LocalRoute, oracle: llama_cpp.Llama) -> None:
    tokens = oracle.tokenize(SHORT.encode())
    first = route.embed(tokens, EmbeddingSpec())
    assert all(backend.slot_length(0) == 0 for backend in route.backends)
    assert np.array_equal(route.embed(tokens, EmbeddingSpec()), first)


@pytest.mark.parametrize("text", [SHORT, LONG], ids=["one-chunk", "two-chunks"])
def test_an_embedding_step_copies_no_logits_and_keeps_the_same_rows(
    route: LocalRoute, oracle: llama_cpp.Llama, text: str
) -> None:
    """Only the final-norm rows are read: the tail hands back no rows x n_vocab logits for them,
    and the rows are those of a step that reads its logits too (the same graph runs)."""
    tail, tokens = route.backends[-1], np.asarray(oracle.tokenize(text.encode()), np.int32)
    outputs = []
    for read_logits in (True, False):
        hidden = None
        for backend in route.backends[:-1]:
            hidden = backend.run([StepInput(0, 0, hidden=hidden) if hidden is not None else StepInput(0, 0, tokens)])[
                0
            ].hidden
        step = StepInput(0, 0, tokens if hidden is None else None, hidden, "all", read_logits)
        outputs.append(tail.run([step])[0])
        route.release(0)
    reading, embedding = outputs
    assert reading.logits is not None and len(reading.logits) == len(tokens)
    assert embedding.logits is None
    assert embedding.normed is not None and np.array_equal(embedding.normed, reading.normed)


def test_pool_takes_the_last_row_and_normalizes_in_float64() -> None:
    rows = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    assert pool(rows, EmbeddingSpec(normalize=False)).tolist() == [3.0, 4.0]
    assert pool(rows, EmbeddingSpec()).tolist() == [0.6, 0.8]
    zero = np.zeros((1, 3), np.float32)
    assert pool(zero, EmbeddingSpec()).tolist() == [0.0, 0.0, 0.0]


def test_pool_without_final_norm_rows_is_a_typed_engine_error() -> None:
    with pytest.raises(EngineError, match="cannot embed"):
        pool(None, EmbeddingSpec())
    with pytest.raises(EngineError):
        pool(np.zeros((0, 4), np.float32), EmbeddingSpec())


def test_only_last_token_pooling_is_served() -> None:
    assert pooling_kind("last") == "last"
    with pytest.raises(InvalidArgument, match="bit for bit"):
        pooling_kind("mean")
