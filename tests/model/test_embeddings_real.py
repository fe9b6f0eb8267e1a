"""SmolLM2-135M-Instruct (Q4_1) embeddings: a 3-way split equals whole-model llama.cpp bit for bit.

The oracle is llama-cpp-python's ``Llama(embedding=True, pooling_type=LAST).embed`` on the whole
GGUF with the shards' chunk size as its micro-batch; the split is three range slices in process
(``LocalRoute.embed``), and a 3-worker swarm through ``POST /v1/embeddings`` with the official
client (float and base64). A one-chunk sentence and a passage over two chunks, normalized and
raw. Needs the provisioned model and MESHNET_ENABLE_REAL_INFERENCE_TESTS=1.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import openai
import pytest
from smollm2_model import MARKS, MODEL

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from swarm_harness import CONTEXT, Swarm

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.provision import DEFAULT_MODEL
from meshnet.core.embedding import EmbeddingSpec
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_local_route
from meshnet.node.config import WorkerConfig

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


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    with Swarm(tmp_path_factory.mktemp("swarm"), MODEL, model_name=DEFAULT_MODEL.name) as swarm:
        swarm.start_tracker()
        swarm.start_workers("0:10", "10:20", "20:30")  # the workers' context: CONTEXT, the oracle's
        base_url = swarm.start_gateway()
        swarm.wait_routable(nodes=3, timeout_s=60)
        with openai.OpenAI(base_url=f"{base_url}/v1", api_key=swarm.api_key, max_retries=0, timeout=120.0) as api:
            yield api


def test_three_worker_swarm_embeddings_equal_llama_cpp(client: openai.OpenAI, oracle: llama_cpp.Llama) -> None:
    assert (CONTEXT, WorkerConfig.prefill_chunk) == (CONFIG.n_ctx_per_slot, CONFIG.max_batch_tokens)  # as the oracle
    texts = [SENTENCE, PASSAGE]
    floats = client.embeddings.create(model=DEFAULT_MODEL.name, input=texts, encoding_format="float")
    packed = client.embeddings.create(model=DEFAULT_MODEL.name, input=texts)  # base64, as the client asks
    for text, as_float, as_base64 in zip(texts, floats.data, packed.data, strict=True):
        expected = np.array(oracle.embed(text, normalize=True), dtype=np.float64)
        got = np.array(as_float.embedding, dtype=np.float64)
        assert np.array_equal(got, expected), f"max |diff| {np.abs(got - expected).max()}"
        assert np.array_equal(np.array(as_base64.embedding, dtype=np.float32), expected.astype(np.float32))
    assert floats.usage.prompt_tokens == sum(len(oracle.tokenize(text.encode())) for text in texts)
