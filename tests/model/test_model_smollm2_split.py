"""SmolLM2-135M-Instruct (Q4_1) on llama.cpp: the split engine against the whole model and stock
llama-cpp-python.

Needs the provisioned model and MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 (``make test`` sets both);
the model is looked up under $MESHNET_DATA_DIR/models (default .data/models).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from smollm2_model import ENABLED_MARK, MODEL, PROVISIONED_MARK

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.gguf_file import parse_gguf
from meshnet.core.generation import GenerationRequest
from meshnet.core.layers import LayerRange
from meshnet.engine.bitwise import bit_identical, describe_difference
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard
from meshnet.engine.tokenizer import Tokenizer

pytestmark = [
    pytest.mark.real_model,
    ENABLED_MARK,
    PROVISIONED_MARK,
]

N_LAYERS = 30
LAYOUTS = {
    "whole": [LayerRange(0, 30)],
    "2 shards": [LayerRange(0, 15), LayerRange(15, 30)],
    "3 shards": [LayerRange(0, 10), LayerRange(10, 20), LayerRange(20, 30)],
}
CONFIG = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=2048, max_batch_tokens=512)
GREEDY_STEPS = 64

PASSAGE = (
    "The lighthouse stood on a narrow spit of rock at the mouth of the harbour, and for more than a "
    "century its keepers climbed the iron stairs each evening to light the lamp. In the early years "
    "the light came from whale oil, later from paraffin, and at last from a single electric bulb set "
    "inside a great lens of polished glass. The lens gathered the light into beams that swept across "
    "the water, so that a sailor twenty miles out could count the flashes and know exactly which coast "
    "lay ahead. Storms were the keepers' real work. When the wind rose they wound the clockwork that "
    "turned the lens, trimmed the wick, and wrote in the log every hour: the direction of the wind, "
    "the state of the sea, the ships that passed. Many of those logs survive, and they read less like "
    "adventure than like patient bookkeeping, which is perhaps why so few ships were lost on that shore. "
)
CHATS = {
    "capital": "What is the capital of France? Answer in one sentence.",
    "code": "Write a Python function that returns the sum of a list of numbers.",
    "story": "Tell me a very short story about a cat who learns to swim.",
    "long document": PASSAGE * 6 + "\n\nSummarize the text above in two sentences.",
}


@pytest.fixture(scope="session")
def tokenizer() -> Iterator[Tokenizer]:
    loaded = Tokenizer(describe_model(MODEL))
    yield loaded
    loaded.close()


@pytest.fixture(scope="session")
def slice_cache(tmp_path_factory: pytest.TempPathFactory) -> SliceCache:
    return SliceCache(tmp_path_factory.mktemp("smollm2-slices"))


@pytest.fixture(scope="session")
def routes(slice_cache: SliceCache) -> Iterator[dict[str, LocalRoute]]:
    opened: dict[str, LocalRoute] = {}
    try:
        for name, ranges in LAYOUTS.items():
            opened[name] = LocalRoute([open_llama_shard(describe_model(MODEL), r, slice_cache, CONFIG) for r in ranges])
        yield opened
    finally:
        for route in opened.values():
            route.close()


@pytest.fixture(scope="session")
def prompts(tokenizer: Tokenizer) -> dict[str, np.ndarray]:
    encoded = {}
    for name, text in CHATS.items():
        encoded[name] = np.array(tokenizer.encode_chat([{"role": "user", "content": text}]), np.int32)
    assert len(encoded["long document"]) > 1000, len(encoded["long document"])
    return encoded


def _prefill_and_greedy(route: LocalRoute, tokens: np.ndarray) -> tuple[np.ndarray, list[int], np.ndarray]:
    """All-row prefill logits, then GREEDY_STEPS greedy tokens and their logits; frees slot 0."""
    try:
        prefill = route.forward(0, 0, tokens, "all")
        rows, chosen = [prefill[-1]], []
        for step in range(GREEDY_STEPS):
            chosen.append(int(np.argmax(rows[-1])))
            if step + 1 < GREEDY_STEPS:
                rows.append(route.forward(0, len(tokens) + step, np.array(chosen[-1:], np.int32))[-1])
        return prefill, chosen, np.stack(rows)
    finally:
        route.release(0)


@pytest.mark.parametrize("name", list(CHATS))
def test_split_is_bit_identical_to_whole(
    routes: dict[str, LocalRoute], prompts: dict[str, np.ndarray], name: str
) -> None:
    tokens = prompts[name]
    started = time.perf_counter()
    prefill, chosen, decode = _prefill_and_greedy(routes["whole"], tokens)
    assert prefill.shape == (len(tokens), 49152) and np.isfinite(prefill).all()
    for layout in ("2 shards", "3 shards"):
        split_prefill, split_chosen, split_decode = _prefill_and_greedy(routes[layout], tokens)
        assert bit_identical(split_prefill, prefill), (
            f"{layout}: prefill logits of {len(tokens)} rows: {describe_difference(prefill, split_prefill)}"
        )
        assert split_chosen == chosen, f"{layout}: greedy tokens diverge"
        assert bit_identical(split_decode, decode), f"{layout}: decode logits differ"
        del split_prefill
    print(
        f"{name}: {len(tokens)} prompt tokens, {GREEDY_STEPS} greedy tokens x 3 routes in "
        f"{time.perf_counter() - started:.1f} s"
    )


def test_whole_route_matches_stock_llama_cpp(
    routes: dict[str, LocalRoute], prompts: dict[str, np.ndarray], tokenizer: Tokenizer
) -> None:
    import llama_cpp  # the reference implementation; only tests import it outside the engine

    tokens = [int(t) for t in prompts["capital"]]
    request = GenerationRequest(tuple(tokens), GREEDY_STEPS, stop_tokens=tokenizer.eos_token_ids)
    ours = [t for t in routes["whole"].generate(request) if t not in tokenizer.eos_token_ids]
    ours_text = tokenizer.decode(ours)
    stock = llama_cpp.Llama(
        model_path=str(MODEL),
        n_ctx=CONFIG.n_ctx_per_slot,
        n_batch=512,
        n_ubatch=512,
        flash_attn=True,
        n_threads=CONFIG.n_threads,
        n_threads_batch=CONFIG.n_threads,
        n_gpu_layers=0,
        verbose=False,
    )
    try:
        completion = stock.create_completion(
            tokens,
            max_tokens=GREEDY_STEPS,
            temperature=0.0,
            top_k=1,
            top_p=1.0,
            min_p=0.0,
            repeat_penalty=1.0,
        )
    finally:
        stock.close()
    stock_text = completion["choices"][0]["text"]  # type: ignore[index]
    assert len(ours) > 3 and "Paris" in ours_text
    assert ours_text == stock_text


def test_slices_are_small_and_vocabulary_free(routes: dict[str, LocalRoute], slice_cache: SliceCache) -> None:
    source_size = MODEL.stat().st_size
    n_vocab = len(parse_gguf(MODEL).get("tokenizer.ggml.tokens"))
    print(f"\nsource {MODEL.name}: {source_size / 1e6:.1f} MB, vocabulary {n_vocab}")
    for ranges in LAYOUTS.values():
        for layers in ranges:
            files = slice_cache.shard_files(MODEL, layers, N_LAYERS)
            sliced = parse_gguf(files.slice)
            size = files.slice.stat().st_size
            role = sliced.get("meshnet.slice.role")
            table = f" + token table {files.embeddings.stat().st_size / 1e6:.1f} MB" if files.embeddings else ""
            print(
                f"  {role:6s} {layers!s:>5}: {size / 1e6:6.1f} MB ({100 * size / source_size:4.1f}% of source){table}"
            )
            if role in ("head", "middle"):
                big = [t.name for t in sliced.tensors.values() if n_vocab in t.shape]
                assert not big, f"{layers}: vocabulary-sized tensors {big}"
    head = slice_cache.shard_files(MODEL, LayerRange(0, 15), N_LAYERS).slice
    assert head.stat().st_size <= 0.40 * source_size, f"a 15-layer head is {head.stat().st_size} bytes"
