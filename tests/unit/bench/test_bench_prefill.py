"""The prefill phase's pure decisions: paired TTFT ratios, first-token agreement, the round budget."""

from __future__ import annotations

import pytest

from meshnet.bench.prefill import another_round_fits, first_tokens_agree, shard_busy
from meshnet.bench.stats import paired_ratio


def test_the_ratio_is_the_median_of_per_round_ratios_over_rounds_both_measured() -> None:
    # Rounds 1 and 3 pair up (0.5 and 0.7); round 2 lost its reference, round 4 its own value.
    assert paired_ratio([5.0, 6.0, 7.0, None], [10.0, None, 10.0, 9.0]) == pytest.approx(0.6)
    assert paired_ratio([None], [10.0]) is None
    assert paired_ratio([3.0], [0.0]) is None


def test_first_tokens_agree_only_when_every_subject_saw_the_same_token() -> None:
    assert first_tokens_agree([[7, 7], [7], [7, 7]]) is True
    assert first_tokens_agree([[7, 7], [7, 8]]) is False  # one round of one subject differs
    assert first_tokens_agree([[7], [9]]) is False
    # A subject that measured nothing does not count; one subject alone agrees with nobody.
    assert first_tokens_agree([[7], []]) is None


def test_the_first_round_always_runs_and_later_ones_only_within_the_budget() -> None:
    assert another_round_fits(elapsed_s=500.0, last_round_s=0.0, budget_s=90.0, completed=0, wanted=3)
    assert another_round_fits(elapsed_s=40.0, last_round_s=30.0, budget_s=90.0, completed=1, wanted=3)
    assert not another_round_fits(elapsed_s=70.0, last_round_s=30.0, budget_s=90.0, completed=2, wanted=3)
    assert not another_round_fits(elapsed_s=1.0, last_round_s=1.0, budget_s=90.0, completed=3, wanted=3)


def test_shard_busy_is_the_engine_time_between_two_snapshots() -> None:
    before = [{"engine_busy_seconds_total": 1.0}, {"engine_busy_seconds_total": 4.0}]
    after = [{"engine_busy_seconds_total": 3.5}, {"engine_busy_seconds_total": 4.0}]
    assert shard_busy(before, after) == [2.5, 0.0]
    assert shard_busy([{}], [{"engine_busy_seconds_total": 2.0}]) == [2.0]
