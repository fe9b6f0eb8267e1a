"""Where a failover resumes (``route.snapshot_resume``): the largest snapshot every hop holds,
with a token left to feed after it, bound to the session's tokens up to it."""

from __future__ import annotations

from meshnet.core.snapshot import tokens_link
from meshnet.route.snapshot_resume import resume_plan, resume_point


def test_the_point_is_the_newest_every_hop_holds() -> None:
    assert resume_point([[96, 64, 32], [64, 32], [96, 64]], prompt_tokens=40, generated=70) == 64
    assert resume_point([[32], []], 40, 70) is None  # a hop holds none: replay from 0
    assert resume_point([], 40, 70) is None


def test_a_token_is_left_to_feed_after_the_point() -> None:
    # 40 + 56 tokens fed would be 96: the route needs a step to sample the next token from.
    assert resume_point([[96, 64]], prompt_tokens=40, generated=56) == 64
    assert resume_point([[96, 64]], prompt_tokens=40, generated=57) == 96
    assert resume_point([[32]], prompt_tokens=40, generated=0) == 32  # lost during the prompt


def test_the_plan_binds_the_tokens_and_advances_the_sampler_past_the_chosen_ones() -> None:
    prompt, history = list(range(10, 50)), list(range(100, 170))
    plan = resume_plan(96, prompt, history)
    assert plan.tokens_link == tokens_link([*prompt, *history][:96])
    # The token at 96 (history[56]) opens the session; it and those before it were chosen already.
    assert plan.sampled == tuple(history[:57])
    assert resume_plan(32, prompt, history).sampled == ()
