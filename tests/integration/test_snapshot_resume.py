"""A session resumed from KV snapshots on routes of real worker processes, against the whole
model run cold in process: the route restores the newest snapshot every hop holds and replays
only the tokens after it, and what it generates is the uninterrupted run's, bit for bit.

Each test plays a failover as the swarm client does: a session runs up to some token on a 3-way
split whose workers snapshot every ``EVERY`` positions (``--snapshot-every``), then the same
session (same id, a newer route epoch) is opened again with the history that lost route
generated, resumed from the snapshot ``RouteDriver.resume`` finds. Two families: llama and gemma3,
whose synthetic model's 8-token sliding window the restored KV reaches far past. A snapshot tampered with
on disk (corrupt, another recipe, range, session or token binding) is refused with the typed
error, and the session completes by replaying from its first token instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from worker_harness import RunningWorker, WorkerCluster, WorkerSpec, greedy_request, metrics, new_driver, route_session

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "engine"))

from engine_routes import greedy
from family_models import spec_for

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.events import RouteHealth, TokenGenerated
from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.ids import SessionId, new_session_id
from meshnet.core.layers import LayerRange, split_evenly
from meshnet.core.sampling_options import LogitAdjustments
from meshnet.core.snapshot import tokens_link
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard
from meshnet.route.driver import RouteDriver
from meshnet.route.shard_stream import ChannelPool
from meshnet.session.snapshots import pack, read_header

pytestmark = pytest.mark.timeout(300)

CONTEXT = 256
CHUNK = 16
EVERY = 32
PROMPT = 40
TOKENS = 100
DISK_MB = 4
SAMPLED = SamplingParams(
    temperature=0.9, seed=11, adjustments=LogitAdjustments(presence_penalty=0.6, frequency_penalty=0.8)
)
CONFIG = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=CONTEXT, max_batch_tokens=CHUNK)


@dataclass
class Setup:
    route: list[RunningWorker]
    data_dir: Path
    prompt: tuple[int, ...]
    expected: list[int]
    sampled: list[int]
    """The whole model's tokens for ``SAMPLED`` (seeded draws, penalties over what it chose)."""


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def setup(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    synthetic_model_factory: Callable[[SyntheticSpec], Path],
) -> Iterator[Setup]:
    spec = spec_for(request.param, "q8_0")  # gemma3's has an 8-token sliding window
    source = synthetic_model_factory(spec)
    description = describe_model(source)
    whole = LocalRoute(
        [
            open_llama_shard(
                description, LayerRange(0, spec.n_layers), SliceCache(tmp_path_factory.mktemp("ref")), CONFIG
            )
        ]
    )
    try:
        n_vocab = whole.backends[-1].shape.n_vocab
        prompt = tuple(int(t) for t in np.random.default_rng(7).integers(3, n_vocab, PROMPT))
        expected = list(greedy(whole, np.array(prompt, np.int32), TOKENS).tokens)
        sampled = list(whole.generate(GenerationRequest(prompt, TOKENS, SAMPLED)))
        # Were the tail's penalty counts lost at the snapshot, the draws after it would not be these.
        unpenalised = replace(SAMPLED, adjustments=LogitAdjustments())
        assert sampled != list(whole.generate(GenerationRequest(prompt, TOKENS, unpenalised)))
    finally:
        whole.close()
    data_dir = tmp_path_factory.mktemp("workers")
    options = {"fake_layers": None, "model": source, "max_sessions": 2, "context": CONTEXT, "threads": 1}
    settings = {"prefill_chunk": CHUNK, "snapshot_every": EVERY, "snapshot_disk_mb": DISK_MB, "prefix_cache_mb": 8}
    with WorkerCluster(data_dir) as cluster:
        specs = [
            WorkerSpec(layers, settings=settings, drain_grace=0, **options) for layers in split_evenly(spec.n_layers, 3)
        ]  # type: ignore[arg-type]
        yield Setup(cluster.start(*specs, timeout_s=120), data_dir, prompt, expected, sampled)


async def _collect(events: object) -> tuple[list[int], list[RouteHealth]]:
    tokens, health = [], []
    async for event in events:  # type: ignore[attr-defined]
        if isinstance(event, TokenGenerated):
            tokens.append(event.token_id)
        if isinstance(event, RouteHealth):
            health.append(event)
    return tokens, health


def _computed(before: Sequence[dict[str, float]], after: Sequence[dict[str, float]]) -> list[int]:
    """Positions each worker's engine computed between two metric reads."""
    return [
        int(a["prefill_tokens_total"] + a["decode_steps_total"] - b["prefill_tokens_total"] - b["decode_steps_total"])
        for b, a in zip(before, after, strict=True)
    ]


async def _run_whole(
    driver: RouteDriver, pool: ChannelPool, setup: Setup, request: GenerationRequest, session: SessionId, reuse: bool
) -> list[int]:
    route = await route_session(pool, setup.route, session_id=session)
    tokens, _ = await _collect(driver.run(route, request, kv="probe" if reuse else None))
    return tokens


async def _resume(
    setup: Setup,
    session: SessionId,
    generated: int,
    tamper: Callable[[int], None] | None = None,
    sampling: SamplingParams | None = None,
    reuse: bool = False,
) -> tuple[int | None, list[int], list[RouteHealth], list[int]]:
    """Run ``session`` up to ``generated`` tokens, then fail it over after ``generated`` tokens; returns the resume
    point, the tokens the resumed route generated, its route notes and what each worker computed."""
    pool = ChannelPool(16 << 20)
    driver = new_driver(pool)
    request = greedy_request(setup.prompt, TOKENS)
    if sampling is not None:
        request = GenerationRequest(setup.prompt, TOKENS, sampling)
    expected = setup.expected if sampling is None else setup.sampled
    try:
        # The lost route: it generated ``generated`` tokens (at least one: a prompt's prefill ends
        # in one) and its shards snapshotted what it fed, keeping each session's newest two.
        lost = replace(request, max_tokens=max(generated, 1))
        assert await _run_whole(driver, pool, setup, lost, session, reuse) == expected[: lost.max_tokens]
        history = tuple(expected[:generated])
        route = await route_session(pool, setup.route, session_id=session, epoch=1)
        plan = await driver.resume(route, request, history)
        if plan is not None and tamper is not None:
            tamper(plan.position)
        before = await metrics(pool, setup.route)
        tokens, health = await _collect(driver.run(route, request, history=history, kv=None, snapshot=plan))
        return (
            None if plan is None else plan.position,
            tokens,
            health,
            _computed(before, await metrics(pool, setup.route)),
        )
    finally:
        await pool.close()


@pytest.mark.parametrize("generated", [0, 30, 70, 99])
def test_resume_from_the_newest_snapshot_equals_the_uninterrupted_run(setup: Setup, generated: int) -> None:
    point, tokens, health, computed = asyncio.run(_resume(setup, new_session_id(), generated))
    fed = PROMPT + generated  # tokens the lost route had fed (the last one generated is fed next)
    assert point is not None and fed - EVERY <= point < fed and point % EVERY == 0
    assert tokens == setup.expected[generated:], "a resumed session must continue as the lost route would"
    assert [note.status for note in health] == ["resumed"]
    # Every hop computed only the positions after the snapshot: the replay does not grow with
    # the history before it (a replay from 0 computes PROMPT + TOKENS - 1 positions).
    assert computed == [PROMPT + TOKENS - 1 - point] * 3, computed


def test_resume_advances_the_tails_penalties_past_the_snapshot(setup: Setup) -> None:
    """The tokens before the snapshot are not sampled again on the new route: the tail counts them
    (penalties) without sampling, and continues with the whole model's seeded, penalised draws."""
    point, tokens, health, _ = asyncio.run(_resume(setup, new_session_id(), 70, sampling=SAMPLED))
    assert point == 96 and [note.status for note in health] == ["resumed"]
    assert tokens == setup.sampled[70:]


def test_a_session_opened_on_a_reused_prompt_prefix_resumes_too(setup: Setup) -> None:
    """The head holds a reused prefix's chain, not its tokens: it links the session's tokens on
    from the link the driver sends with the prefix, so its snapshots bind as a cold session's."""
    asyncio.run(_resume(setup, new_session_id(), 70, reuse=True))  # keeps the prompt's prefix

    async def hits() -> list[float]:
        pool = ChannelPool(16 << 20)
        try:
            return [values["prefix_hits_total"] for values in await metrics(pool, setup.route)]
        finally:
            await pool.close()

    before = asyncio.run(hits())
    point, tokens, health, _ = asyncio.run(_resume(setup, new_session_id(), 70, reuse=True))
    assert [a - b for a, b in zip(asyncio.run(hits()), before, strict=True)] == [1, 1, 1], "the prefix was not reused"
    assert point == 96 and [note.status for note in health] == ["resumed"]
    assert tokens == setup.expected[70:]


def _snapshot_files(setup: Setup, session: SessionId, point: int) -> dict[LayerRange, Path]:
    name = f"{hashlib.sha256(session.encode()).hexdigest()[:32]}_{point}.kvsnap"
    files = {read_header(path.read_bytes())[0].layers: path for path in setup.data_dir.glob(f"*/snapshots/*/{name}")}
    assert len(files) == 3, files
    return files


def _repack(path: Path, **changes: object) -> None:
    data = path.read_bytes()
    header, start = read_header(data)
    header = replace(header, **changes)  # type: ignore[arg-type]
    path.write_bytes(
        pack(header.fingerprint, header.layers, header.session_id, header.positions, header.tokens_link, data[start:])
    )


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


TAMPERS: dict[str, Callable[[dict[LayerRange, Path]], None]] = {
    "corrupt": lambda files: _corrupt(sorted(files.items())[1][1]),
    "foreign_recipe": lambda files: _repack(sorted(files.items())[1][1], fingerprint="another-recipe"),
    "wrong_range": lambda files: sorted(files.items())[1][1].write_bytes(sorted(files.items())[2][1].read_bytes()),
    "other_session": lambda files: _repack(sorted(files.items())[2][1], session_id=SessionId("s-another")),
    "other_tokens": lambda files: _repack(sorted(files.items())[0][1], tokens_link=tokens_link([1, 2, 3])),
}


@pytest.mark.parametrize("kind", sorted(TAMPERS))
def test_a_refused_snapshot_falls_back_to_a_replay_from_the_first_token(setup: Setup, kind: str) -> None:
    session = new_session_id()
    point, tokens, health, computed = asyncio.run(
        _resume(setup, session, 70, lambda at: TAMPERS[kind](_snapshot_files(setup, session, at)))
    )
    assert point == 96
    assert [note.status for note in health] == ["snapshot_refused"], health
    assert tokens == setup.expected[70:]
    # The fallback replays the session from its first token (hops before the one that refused ran
    # the opening frame on the KV they restored, before the refusal came back: one position more).
    assert all(c - (PROMPT + TOKENS - 1) in (0, 1) for c in computed), computed


def test_snapshot_files_stay_private_and_within_the_disk_budget(setup: Setup) -> None:
    asyncio.run(_resume(setup, new_session_id(), 10))
    directories = list(setup.data_dir.glob("*/snapshots/*"))
    assert len(directories) == 3
    for directory in directories:
        files = list(directory.iterdir())
        assert files and sum(path.stat().st_size for path in files) <= DISK_MB * 2**20
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in files)
