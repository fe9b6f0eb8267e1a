"""Prompt KV reuse on a three-shard route wired as production wires it (``worker_shards``, fake
engine): what a shard keeps, what it restores, and what it refuses.

The fake engine's "KV" is a running summary of every row a slot has seen, so a session that
restored the wrong prefix (or none) samples other tokens than the whole route run cold: each
test compares with ``reference_tokens``. Bit-exactness on llama.cpp is
tests/integration/test_prefix_reuse.py's (real worker processes, every family).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import numpy as np
import pytest
from worker_shards import CHUNK_TOKENS, FINGERPRINT, Route, on_ring, opening, reference_tokens, start_route

from meshnet.core.errors import IntegrityError, InvalidArgument, PrefixEvicted
from meshnet.core.prefix import KvPlan, PrefixKey, prefix_chain
from meshnet.wire.frames import StepFrame, StepResult

THREE = ((0, 2), (2, 4), (4, 6))
PROMPT = tuple((index * 5 + 3) % 60 for index in range(3 * CHUNK_TOKENS + 2))
"""Three whole chunks and two tokens more."""
KEY = PrefixKey(FINGERPRINT, CHUNK_TOKENS)
pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def route() -> AsyncIterator[Route]:
    started = await start_route(THREE, kv_budget=1 << 20)
    yield started
    await started.close()


def _planned(route: Route, session: str, prompt: tuple[int, ...], plan: KvPlan) -> StepFrame:
    """The opening frame of a session that reuses ``plan.reused_blocks`` chunks: it starts there."""
    start = plan.reused_blocks * CHUNK_TOKENS
    frame = opening(route, session, prompt[start:])
    return replace(frame, meta=replace(frame.meta, position=start), kv=plan)


async def _generate(route: Route, frame: StepFrame, steps: int) -> list[int]:
    sender = route.sender()
    result: StepResult = await sender.exchange(frame)
    tokens = [int(result.token_id)]  # type: ignore[arg-type]
    for step in range(1, steps):
        result = await sender.exchange(on_ring(frame, (tokens[-1],), step=step, position=result.next_position))
        tokens.append(int(result.token_id))  # type: ignore[arg-type]
    await sender.close()
    return tokens


async def _serve(route: Route, session: str, prompt: tuple[int, ...], reused: int, steps: int = 4) -> list[int]:
    chain = prefix_chain(KEY, prompt)
    plan = KvPlan(chain, reused, len(chain) if len(chain) > reused else 0)
    return await _generate(route, _planned(route, session, prompt, plan), steps)


async def test_a_prompt_that_starts_like_a_kept_one_restores_it_everywhere(route: Route) -> None:
    longer = (*PROMPT, 7, 7, 7, 7, 7)
    assert await _serve(route, "a", PROMPT, 0) == reference_tokens(THREE, PROMPT, 4)
    chain = prefix_chain(KEY, longer)
    assert [shard.held_kv(FINGERPRINT, chain) for shard in route.shards] == [3, 3, 3]
    assert await _serve(route, "b", longer, 3) == reference_tokens(THREE, longer, 4)
    stores = [shard.kv.store for shard in route.shards]
    assert [s.stats.hits for s in stores] == [1, 1, 1]
    assert [s.stats.reused_tokens for s in stores] == [3 * CHUNK_TOKENS] * 3
    # The longer prompt's own whole chunks (4) are kept too, beside the shorter prompt's (3).
    assert [shard.held_kv(FINGERPRINT, chain) for shard in route.shards] == [4, 4, 4]


async def test_another_recipe_or_tenant_holds_nothing(route: Route) -> None:
    await _serve(route, "a", PROMPT, 0)
    salted = prefix_chain(PrefixKey(FINGERPRINT, CHUNK_TOKENS, "prompt|salt:other"), PROMPT)
    assert route.head.held_kv(FINGERPRINT, salted) == 0
    assert route.head.held_kv("rcp-another-recipe", prefix_chain(KEY, PROMPT)) == 0


async def test_a_chain_that_is_not_the_tokens_is_refused_before_anything_is_kept(route: Route) -> None:
    """A client sending one prompt's chain with another's tokens would plant wrong KV under the
    first prompt's key on the shards that never see tokens: the head refuses the session."""
    victim = tuple(reversed(PROMPT))
    chain = prefix_chain(KEY, victim)
    frame = opening(route, "poison", PROMPT)
    with pytest.raises(IntegrityError, match="do not hash to the prefix chain"):
        await route.sender().exchange(replace(frame, kv=KvPlan(chain, 0, len(chain))))
    assert [shard.held_kv(FINGERPRINT, chain) for shard in route.shards] == [0, 0, 0]
    assert [shard.open_sessions for shard in route.shards] == [0, 0, 0]


async def test_a_prefix_evicted_after_the_probe_fails_the_opening_with_a_typed_error(route: Route) -> None:
    await _serve(route, "a", PROMPT, 0)
    chain = prefix_chain(KEY, PROMPT)
    tail_store = route.shards[-1].kv.store
    kept = tail_store.longest(chain)
    assert kept is not None
    # Another prompt's KV comes in and the least recently used goes, as under memory pressure.
    tail_store.budget_bytes = kept.size
    assert tail_store.put(replace(kept, chain=(b"\1" * 16,)))
    assert tail_store.longest(chain) is None and tail_store.stats.evictions == 1
    with pytest.raises(PrefixEvicted):
        await _serve(route, "b", PROMPT, 3)
    assert [shard.open_sessions for shard in route.shards] == [0, 0, 0]
    # Opened again without reuse, the same session computes everything and is right.
    assert await _serve(route, "b", PROMPT, 0) == reference_tokens(THREE, PROMPT, 4)


async def test_a_plan_is_refused_where_it_cannot_be_served(route: Route) -> None:
    chain = prefix_chain(KEY, PROMPT)
    frame = opening(route, "c", PROMPT)
    moved = replace(frame, meta=replace(frame.meta, position=CHUNK_TOKENS + 1), kv=KvPlan(chain, 1, 3))
    with pytest.raises(InvalidArgument, match="must start at"):
        await route.sender().exchange(moved)
    with pytest.raises(InvalidArgument, match="position 0"):
        replace(frame, meta=replace(frame.meta, position=CHUNK_TOKENS))  # no plan: a new KV starts at 0


async def test_decode_rows_are_never_kept_as_a_prompt(route: Route) -> None:
    """The plan asks to keep more chunks than the prompt has: decode steps would write them,
    and decode rows are not what a prefill computes, so nothing is kept."""
    chain = prefix_chain(KEY, (*PROMPT, *range(8)))
    plan = KvPlan(chain, 0, len(chain))  # 5 chunks; the prompt has 3 whole ones and 2 tokens
    frame = opening(route, "d", PROMPT)
    await _generate(route, replace(frame, kv=plan), 8)
    assert [shard.held_kv(FINGERPRINT, chain) for shard in route.shards] == [0, 0, 0]


def test_the_chain_covers_whole_chunks_only() -> None:
    chain = prefix_chain(KEY, np.arange(2 * CHUNK_TOKENS + 3))
    assert len(chain) == 2
    assert prefix_chain(KEY, np.arange(2 * CHUNK_TOKENS)) == chain
    assert prefix_chain(KEY, np.arange(1, 2 * CHUNK_TOKENS + 1))[0] != chain[0]
