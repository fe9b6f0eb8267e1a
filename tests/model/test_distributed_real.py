"""SmolLM2-135M-Instruct (Q4_1) served by three real worker processes (layers 0:10, 10:20, 20:30).

Logits never cross the wire, so the distributed route is held to the greedy tokens of the
in-process whole model (one shard, the worker's own engine settings): 64 tokens each, identical,
for a short chat and a chat of over 1,000 prompt tokens. Then 8 sessions decode at once through
the same workers (so the shards batch them) and each must equal its solo run; the KV is idle after.

Needs MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 and the provisioned model under
$MESHNET_DATA_DIR/models (default .data/models).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# The worker harness lives with the integration tests; this directory is not a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from smollm2_model import ENABLED_MARK, MODEL, PROVISIONED_MARK
from worker_harness import (
    RunningWorker,
    WorkerCluster,
    WorkerSpec,
    generate,
    greedy_request,
    metrics,
    new_driver,
    wait_idle,
)

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.layers import LayerRange
from meshnet.node.config import WorkerConfig
from meshnet.route.shard_stream import ChannelPool

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.timeout(300),
    ENABLED_MARK,
    PROVISIONED_MARK,
]

RANGES = [(0, 10), (10, 20), (20, 30)]
CONTEXT = 2048
MAX_SESSIONS = 8
PREFILL_CHUNK = WorkerConfig.prefill_chunk
"""The worker's default; the reference must cut prompts at the same places."""
GREEDY_TOKENS = 64
WORKER_THREADS = 1
"""Three workers share 2 cores: with 2 threads each, llama.cpp's spinning thread barriers fight
over the cores whenever the stages compute at once (8 concurrent sessions ran ~3x slower than one
after another). Thread count does not change the arithmetic (checked: 1-thread workers match a
2-thread reference); the in-process reference uses 1 too, which is fastest on a busy machine."""

PASSAGE = (
    "The old railway line ran along the river for forty miles, and the villages it served grew up "
    "around its stations like beads on a string. Each morning a slow train carried milk, letters and "
    "schoolchildren down the valley, and each evening it carried them back again. The stationmasters "
    "kept gardens on the platforms, and there was a friendly rivalry over whose roses were the finest. "
    "When the line closed, the tracks were lifted and the cuttings filled with brambles, but the "
    "station buildings remained, and most of them became houses, shops or small museums. "
)
CHATS = {
    "short": "What is the capital of France? Answer in one sentence.",
    "long": PASSAGE * 14 + "\n\nSummarize the text above in two sentences.",
}
CONCURRENT = [
    "Name three colours of the rainbow.",
    "Write a haiku about the sea.",
    "What is two plus two?",
    "Give me a tip for learning to cook.",
    "Why is the sky blue? One sentence.",
    "List the days of the week.",
    "Translate 'good morning' into French.",
    "Describe a cat in five words.",
]


@pytest.fixture(scope="module")
def tokenizer() -> Iterator[object]:
    from meshnet.engine.tokenizer import Tokenizer

    loaded = Tokenizer(describe_model(MODEL))
    yield loaded
    loaded.close()


def encode_chat(tokenizer: object, text: str) -> list[int]:
    return [int(t) for t in tokenizer.encode_chat([{"role": "user", "content": text}])]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The whole model in process, with the engine settings every worker runs."""
    from meshnet.engine.llama_config import LlamaConfig
    from meshnet.engine.shards import open_local_route

    config = LlamaConfig(
        n_threads=WORKER_THREADS, max_slots=MAX_SESSIONS, n_ctx_per_slot=CONTEXT, max_batch_tokens=PREFILL_CHUNK
    )
    route = open_local_route(describe_model(MODEL), 1, SliceCache(tmp_path_factory.mktemp("reference-slices")), config)
    yield route
    route.close()


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningWorker]]:
    started = time.monotonic()
    with WorkerCluster(tmp_path_factory.mktemp("real-workers")) as cluster:
        specs = [
            WorkerSpec(
                LayerRange(start, stop),
                fake_layers=None,
                model=MODEL,
                context=CONTEXT,
                max_sessions=MAX_SESSIONS,
                threads=WORKER_THREADS,
            )
            for start, stop in RANGES
        ]
        running = cluster.start(*specs, timeout_s=120)
        print(f"\n3 real workers ready in {time.monotonic() - started:.1f} s")
        yield running


def in_process(reference: object, prompt: list[int]) -> list[int]:
    return list(reference.generate(greedy_request(prompt, GREEDY_TOKENS)))  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", list(CHATS))
async def test_three_real_workers_give_the_whole_models_greedy_tokens(
    pool: ChannelPool, workers: list[RunningWorker], reference: object, tokenizer: object, name: str
) -> None:
    prompt = encode_chat(tokenizer, CHATS[name])
    if name == "long":
        assert len(prompt) > 1000, len(prompt)
    started = time.monotonic()
    expected = in_process(reference, prompt)
    local_s = time.monotonic() - started
    started = time.monotonic()
    distributed = await generate(pool, new_driver(pool), workers, greedy_request(prompt, GREEDY_TOKENS))
    remote_s = time.monotonic() - started
    print(
        f"\n{name}: {len(prompt)} prompt tokens; {GREEDY_TOKENS} greedy tokens in process {local_s:.1f} s, "
        f"over 3 workers {remote_s:.1f} s: {tokenizer.decode(distributed)[:60]!r}"
    )  # type: ignore[attr-defined]
    assert len(distributed) == GREEDY_TOKENS
    assert distributed == expected
    await wait_idle(pool, workers)


async def test_eight_concurrent_real_sessions_equal_their_solo_runs(
    pool: ChannelPool, workers: list[RunningWorker], reference: object, tokenizer: object
) -> None:
    prompts = [encode_chat(tokenizer, text) for text in CONCURRENT]
    driver = new_driver(pool)
    started = time.monotonic()
    solo = [await generate(pool, driver, workers, greedy_request(p, GREEDY_TOKENS)) for p in prompts]
    solo_s = time.monotonic() - started
    # Staggered lengths: short sessions end and free their KV while longer ones still decode, so
    # the survivors' new tokens land in KV cells freed by others (where cross-talk would show).
    lengths = [GREEDY_TOKENS * (index + 1) // len(prompts) for index in range(len(prompts))]
    before = await metrics(pool, workers)
    started = time.monotonic()
    together = await asyncio.gather(
        *(generate(pool, driver, workers, greedy_request(p, n)) for p, n in zip(prompts, lengths, strict=True))
    )
    together_s = time.monotonic() - started
    after = await metrics(pool, workers)
    occupancy = [
        round(
            (a["decode_steps_total"] - b["decode_steps_total"])
            / max(a["decode_batches_total"] - b["decode_batches_total"], 1),
            2,
        )
        for a, b in zip(after, before, strict=True)
    ]
    print(
        f"\n8 sessions: solo one after another ({GREEDY_TOKENS} tokens each) {solo_s:.1f} s, together "
        f"({lengths[0]}..{lengths[-1]} tokens) {together_s:.1f} s; decode steps per batch {occupancy}"
    )
    assert len({tuple(tokens) for tokens in solo}) == len(prompts), "prompts must give different answers"
    for index, tokens in enumerate(together):
        # Greedy: a shorter run is a prefix of the longer solo run.
        assert tokens == solo[index][: lengths[index]], f"session {index} differs from its solo run"
    # The solo runs are the whole model's too (two checked here; the tests above cover the route).
    for index in range(2):
        assert solo[index] == in_process(reference, prompts[index])
    assert max(occupancy) > 1.0, "the workers never batched"
    # Ring rows of the sessions a step ran together crossed each seam (and came back from the tail)
    # in one ring batch message: fewer seam messages than session rows on every worker.
    sent = [
        (a["seam_messages_total"] - b["seam_messages_total"], a["seam_rows_total"] - b["seam_rows_total"])
        for a, b in zip(after, before, strict=True)
    ]
    print(f"seam (messages, rows) per worker: {sent}")
    assert all(messages < rows for messages, rows in sent), sent
    await wait_idle(pool, workers)
