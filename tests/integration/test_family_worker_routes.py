"""Every certified family over routes of real worker processes (gRPC seams), against the whole
model in process: 32 greedy tokens identical, and 8 sessions decoding at once on the route each
identical to the whole model decoding it alone, their ring rows batched (fewer seam messages
than rows on every worker).

The in-process grid (tests/unit/engine/test_engine_families.py) covers every weight type and cut
with prefill logits 0.0 apart; here each family runs one legacy and one K-quant type at two cut
patterns (gemma3: one cut on its window period, one off it), over the wire.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from worker_harness import RunningWorker, WorkerCluster, WorkerSpec, generate, greedy_request, metrics, new_driver

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "engine"))

from engine_routes import greedy
from family_models import CUTS, prompt_for, spec_for

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import FAMILIES, SyntheticSpec
from meshnet.core.layers import LayerRange
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard
from meshnet.route.shard_stream import ChannelPool

pytestmark = pytest.mark.timeout(180)

SESSIONS = 8
CONTEXT = 128
CHUNK = 32
TOKENS = 32
# The workers' recipe: the same chunking and threads as the reference, so the arithmetic is too.
CONFIG = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=CONTEXT, max_batch_tokens=CHUNK)
QUANTS = ("q8_0", "q4_k")
# Two cuts sharing a range, so four workers serve both routes of a model.
PICKED = {family: ("halves", "3-1") for family in FAMILIES}
PICKED["gemma3"] = ("on the period", "off the period")
PAIRS = [(family, quant) for family in FAMILIES for quant in QUANTS]


def _reference(family: str, source: Path, cache: Path) -> tuple[list[tuple[int, ...]], list[list[int]]]:
    """Eight prompts and the whole model's solo greedy tokens for each."""
    description = describe_model(source)
    whole = LocalRoute([open_llama_shard(description, LayerRange(0, description.n_layers), SliceCache(cache), CONFIG)])
    try:
        n_vocab = whole.backends[-1].shape.n_vocab
        prompts = [tuple(int(t) for t in prompt_for(family, n_vocab, 12, seed)) for seed in range(SESSIONS)]
        return prompts, [greedy(whole, prompt, TOKENS).tokens for prompt in prompts]  # type: ignore[arg-type]
    finally:
        whole.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[WorkerCluster]:
    with WorkerCluster(tmp_path / "workers") as running:
        yield running


async def _run(route: Sequence[RunningWorker], prompts: Sequence[tuple[int, ...]]) -> list[list[int]]:
    pool = ChannelPool(16 * 1024 * 1024)
    driver = new_driver(pool)
    try:
        return list(await asyncio.gather(*(generate(pool, driver, route, greedy_request(p, TOKENS)) for p in prompts)))
    finally:
        await pool.close()


async def _seams(route: Sequence[RunningWorker]) -> list[tuple[float, float]]:
    """Each worker's seam messages and the session rows they carried so far."""
    pool = ChannelPool(16 * 1024 * 1024)
    try:
        return [(m["seam_messages_total"], m["seam_rows_total"]) for m in await metrics(pool, route)]
    finally:
        await pool.close()


@pytest.mark.parametrize(("family", "quant"), PAIRS, ids=[f"{f}-{q}" for f, q in PAIRS])
def test_worker_routes_match_the_whole_model(
    family: str,
    quant: str,
    cluster: WorkerCluster,
    synthetic_model_factory: Callable[[SyntheticSpec], Path],
    tmp_path: Path,
) -> None:
    spec = spec_for(family, quant)
    source = synthetic_model_factory(spec)
    prompts, expected = _reference(family, source, tmp_path / "ref-cache")
    cuts = {name: [LayerRange(a, b) for a, b in CUTS[family][name]] for name in PICKED[family]}
    ranges = sorted({layers for cut in cuts.values() for layers in cut})
    options = {
        **{"fake_layers": None, "model": source, "max_sessions": SESSIONS, "context": CONTEXT, "threads": 1},
        "drain_grace": 0,
    }
    settings = {"prefill_chunk": CHUNK}
    started = cluster.start(*(WorkerSpec(layers, settings=settings, **options) for layers in ranges), timeout_s=120)  # type: ignore[arg-type]
    by_range = dict(zip(ranges, started, strict=True))
    for name, cut in cuts.items():
        route = [by_range[layers] for layers in cut]
        solo = asyncio.run(_run(route, prompts[:1]))
        assert solo == expected[:1], f"{name}: 32 greedy tokens differ"
        before = asyncio.run(_seams(route))
        together = asyncio.run(_run(route, prompts))
        assert together == expected, f"{name}: a session decoded beside seven others differs from solo"
        # The decode rows of the sessions an engine step ran together crossed each seam, and came
        # back from the tail, in one ring batch message: fewer messages than rows on every worker.
        sent = [(m - m0, r - r0) for (m, r), (m0, r0) in zip(asyncio.run(_seams(route)), before, strict=True)]
        assert all(messages < rows for messages, rows in sent), f"{name}: (messages, rows) {sent}"
