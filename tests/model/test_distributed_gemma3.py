"""Gemma 3 270M over three real worker processes equals the whole model in process.

The cuts 7 and 13 fall off the 6-layer window period. Same needs as ``test_model_gemma3_split``
(MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 and ``meshnet provision gemma3-270m``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from gemma3_model import MARKS, MODEL, open_tokenizer
from worker_harness import RunningWorker, WorkerCluster, WorkerSpec, generate, greedy_request, new_driver

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.layers import LayerRange
from meshnet.node.config import WorkerConfig
from meshnet.route.shard_stream import ChannelPool

pytestmark = [*MARKS, pytest.mark.timeout(600)]

RANGES = [(0, 7), (7, 13), (13, 18)]
CONTEXT = 1024
PREFILL_CHUNK = WorkerConfig.prefill_chunk
"""The worker's default; the reference must cut prompts at the same places."""
GREEDY_TOKENS = 64
PROMPTS = {
    "capital": "The capital of France is",
    "code": "def fibonacci(n):\n",
    "list": "Three colours of the rainbow are",
}


tokenizer = pytest.fixture(scope="module")(open_tokenizer)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from meshnet.engine.llama_config import LlamaConfig
    from meshnet.engine.shards import open_local_route

    config = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=CONTEXT, max_batch_tokens=PREFILL_CHUNK)
    route = open_local_route(describe_model(MODEL), 1, SliceCache(tmp_path_factory.mktemp("gemma3-reference")), config)
    yield route
    route.close()


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningWorker]]:
    started = time.monotonic()
    with WorkerCluster(tmp_path_factory.mktemp("gemma3-workers")) as cluster:
        specs = [
            WorkerSpec(LayerRange(a, b), fake_layers=None, model=MODEL, context=CONTEXT, max_sessions=2, threads=1)
            for a, b in RANGES
        ]
        running = cluster.start(*specs, timeout_s=300)
        print(f"\n3 gemma3 workers ready in {time.monotonic() - started:.1f} s")
        yield running


@pytest.mark.parametrize("name", sorted(PROMPTS))
async def test_three_gemma3_workers_give_the_whole_models_greedy_tokens(
    pool: ChannelPool, workers: list[RunningWorker], reference: object, tokenizer: object, name: str
) -> None:
    prompt = [int(t) for t in tokenizer.encode(PROMPTS[name], add_special=True)]  # type: ignore[attr-defined]
    expected = list(reference.generate(greedy_request(prompt, GREEDY_TOKENS)))  # type: ignore[attr-defined]
    distributed = await generate(pool, new_driver(pool), workers, greedy_request(prompt, GREEDY_TOKENS))
    print(f"\n{name}: {tokenizer.decode(distributed)[:60]!r}")  # type: ignore[attr-defined]
    assert len(distributed) == GREEDY_TOKENS
    assert distributed == expected
