"""What a route reuses of a prompt's held prefix (``route.kv_plan.reuse_plan``): a pure choice."""

from __future__ import annotations

from meshnet.core.prefix import KvPlan
from meshnet.route.kv_plan import reuse_plan

CHAIN = tuple(bytes([n]) * 16 for n in range(4))


def test_the_route_reuses_what_every_hop_holds() -> None:
    assert reuse_plan(CHAIN, [4, 2, 3], 4 * 64 + 10, 64, "prompt") == KvPlan(CHAIN, 2, 4)
    assert reuse_plan(CHAIN, [4, 0, 4], 4 * 64 + 10, 64, "prompt") == KvPlan(CHAIN, 0, 4)


def test_the_prompts_last_token_is_always_computed() -> None:
    """An aligned prompt held whole still runs its last chunk: the tail samples from its logits."""
    assert reuse_plan(CHAIN, [4, 4], 4 * 64, 64, "prompt") == KvPlan(CHAIN, 3, 4)


def test_a_prompt_held_whole_keeps_nothing_new() -> None:
    assert reuse_plan(CHAIN, [4, 4], 4 * 64 + 1, 64, "prompt") == KvPlan(CHAIN, 4, 0)
