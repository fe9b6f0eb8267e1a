"""SmolLM2-135M-Instruct (Q4_1) embeddings: a 3-way split equals whole-model llama.cpp bit for bit.

The oracle is llama-cpp-python's ``Llama(embedding=True, pooling_type=LAST).embed`` on the whole
GGUF with the shards' chunk size as its micro-batch; the split is three range slices in process
(``LocalRoute.embed``). A one-chunk sentence and a passage over two chunks, normalized and raw.
Needs the provisioned model and MESHNET_ENABLE_REAL_INFERENCE_TESTS=1.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from smollm2_model import MARKS, MODEL

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.embedding import EmbeddingSpec
from meshnet.engine.llama_backend import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_local_route

pytestmark = [*MARKS, pytest.mark.timeout(600)]

CONFIG = LlamaConfig(n_threads=2, max_slots=1, n_ctx_per_slot=512, max_batch_tokens=64)
SENTENCE = "A lighthouse keeps ships off the rocks at night."
PASSAGE = " ".join(
    [
        "The lighthouse stood on a narrow spit of rock at the mouth of the harbour, and for more than",
        "a century its keepers climbed the iron stairs each evening to light the lamp. In the early",
        "years the light burned whale oil, later paraffin, and at last electricity from a cable laid",
        "across the seabed, which the fishermen blamed for every poor season that followed.",
    ]
)


@pytest.fixture(scope="module")
def oracle() -> Iterator[llama_cpp.Llama]:
    llm = llama_cpp.Llama(
        str(MODEL),
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_LAST,
        n_ctx=CONFIG.n_ctx_per_slot,
        n_batch=CONFIG.n_ctx_per_slot,
        n_ubatch=CONFIG.max_batch_tokens,
        n_threads=CONFIG.n_threads,
        flash_attn=CONFIG.flash_attn,
        verbose=False,
    )
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRoute]:
    route = open_local_route(describe_model(Path(MODEL)), 3, SliceCache(tmp_path_factory.mktemp("cache")), CONFIG)
    yield route
    route.close()


@pytest.mark.parametrize("text", [SENTENCE, PASSAGE], ids=["sentence", "passage"])
@pytest.mark.parametrize("normalize", [True, False])
def test_three_way_split_embedding_equals_llama_cpp(
    split: LocalRoute, oracle: llama_cpp.Llama, text: str, normalize: bool
) -> None:
    tokens = oracle.tokenize(text.encode())
    expected = np.array(oracle.embed(text, normalize=normalize), dtype=np.float64)
    got = split.embed(tokens, EmbeddingSpec(normalize=normalize))
    assert np.array_equal(got, expected), f"max |diff| {np.abs(got - expected).max()}"
