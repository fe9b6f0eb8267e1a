"""A shard with a Q8_0 LM head on one CPU thread measures, at start-up, from how many rows a decode
call through it is cheaper than one call a row (``engine.call_costs``): the pure measurement over
given call costs, and a real llama.cpp tail of the synthetic model, which measures, leaves no KV
behind and computes what a shard that never measured computes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.engine.batching import fewest_from_costs
from meshnet.engine.bitwise import bit_identical
from meshnet.engine.call_costs import BUDGET_S, MOST_ROUNDS, measure_call_costs
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.shards import open_llama_shard


class Priced:
    """Call costs by row count, as a CPU would charge them; records the calls asked for."""

    def __init__(self, per_call: dict[int, float]) -> None:
        self.per_call = per_call
        self.asked: list[int] = []

    def __call__(self, rows: int) -> float:
        self.asked.append(rows)
        return self.per_call[rows]


def test_the_measurement_times_each_count_in_rounds_and_keeps_the_cheaper_path() -> None:
    cpu = Priced({1: 0.0085, 2: 0.0127, 4: 0.019, 8: 0.0328})
    costs = measure_call_costs(cpu, 8)
    assert costs is not None and costs.fewest == 2
    assert costs.calls == ((1, 0.0085), (2, 0.0127), (4, 0.019), (8, 0.0328))
    # Two warm-up calls of one row, then rounds of 1, 2, 4, 8 (no call follows one of its size).
    assert cpu.asked == [1, 1] + [1, 2, 4, 8] * costs.rounds and costs.rounds == MOST_ROUNDS
    assert "from 2 row(s)" in costs.describe() and "8: 4.10" in costs.describe()
    dear = measure_call_costs(Priced({1: 0.0028, 2: 0.0082, 4: 0.0131, 8: 0.0209}), 8)
    assert dear is not None and dear.fewest == 8


def test_only_counts_a_call_may_carry_are_measured() -> None:
    cpu = Priced({1: 0.001, 2: 0.0015, 4: 0.0025})
    costs = measure_call_costs(cpu, 6)
    assert costs is not None and [rows for rows, _ in costs.calls] == [1, 2, 4] and 8 not in cpu.asked
    assert measure_call_costs(Priced({1: 0.001}), 1) is None  # nothing can batch: nothing measured


def test_a_shard_too_slow_for_one_round_in_the_budget_measures_nothing_more() -> None:
    # A 3B-sized tail: one row ~0.1 s, a round of 1+2+4+8 rows ~1.5 s of CPU.
    slow = Priced({1: 0.1, 2: 0.15, 4: 0.25, 8: 0.4})
    assert measure_call_costs(slow, 8, budget_s=BUDGET_S) is None
    assert slow.asked == [1, 1]
    # Within the budget it takes as many rounds as fit, never more than MOST_ROUNDS.
    fits_two = Priced({1: 0.03, 2: 0.04, 4: 0.07, 8: 0.12})
    costs = measure_call_costs(fits_two, 8, budget_s=1.0)
    assert costs is not None and costs.rounds == 2


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> SliceCache:
    return SliceCache(tmp_path_factory.mktemp("call-costs"))


@contextmanager
def _tail(model: Path, cache: SliceCache, config: LlamaConfig) -> Iterator[LlamaBackend]:
    description = describe_model(model)
    backend = open_llama_shard(description, LayerRange(3, description.n_layers), cache, config)
    try:
        yield backend
    finally:
        backend.close()


def _decode(backend: LlamaBackend, hidden: np.ndarray) -> list[np.ndarray]:
    """Three sessions' prompts, then four one-token steps of all three in one run each."""
    rows = []
    for slot in range(3):
        backend.run([StepInput(slot, 0, hidden=hidden[slot * 5 : slot * 5 + 5], want_logits="last")])
    for step in range(4):
        steps = [
            StepInput(slot, 5 + step, hidden=hidden[20 + step * 3 + slot : 21 + step * 3 + slot]) for slot in range(3)
        ]
        rows.extend(out.logits for out in backend.run(steps))  # type: ignore[misc]
    return rows


def test_a_tail_measures_at_start_and_computes_what_an_unmeasured_one_does(
    tiny_model: Path, cache: SliceCache, small_llama_config: LlamaConfig
) -> None:
    # The synthetic model's tied Q8_0 table is its tail's LM head; served on one CPU thread.
    served = replace(small_llama_config, max_slots=8, split_small_decode_batches=True)
    hidden = np.random.default_rng(5).standard_normal((40, 64)).astype(np.float32)
    with _tail(tiny_model, cache, served) as measured:
        costs = measured.call_costs
        assert costs is not None and [rows for rows, _ in costs.calls] == [1, 2, 4, 8]
        assert costs.fewest == fewest_from_costs(costs.calls[0][1], dict(costs.calls[1:]))
        assert [measured.slot_length(slot) for slot in range(8)] == [0] * 8  # no KV left behind
        got = _decode(measured, hidden[:, : measured.shape.n_embd])
    # Set by the config, nothing is measured; one row per call (8) and one call (1) alike compute it.
    for fixed in (8, 1):
        with _tail(tiny_model, cache, replace(served, lm_head_batch_from=fixed)) as unmeasured:
            assert unmeasured.call_costs is None
            expected = _decode(unmeasured, hidden[:, : unmeasured.shape.n_embd])
            assert all(bit_identical(a, b) for a, b in zip(got, expected, strict=True))


def test_a_head_and_a_tail_without_rowwise_calls_measure_nothing(
    tiny_model: Path, cache: SliceCache, small_llama_config: LlamaConfig
) -> None:
    description = describe_model(tiny_model)
    head = open_llama_shard(
        description, LayerRange(0, 3), cache, replace(small_llama_config, split_small_decode_batches=True)
    )
    try:
        assert head.call_costs is None  # it multiplies no LM head
    finally:
        head.close()
    with _tail(tiny_model, cache, small_llama_config) as tail:  # rowwise calls off, as certification runs
        assert tail.call_costs is None


def test_a_batch_threshold_below_one_row_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="at least 1 row"):
        LlamaConfig(n_threads=1, max_slots=2, n_ctx_per_slot=64, max_batch_tokens=16, lm_head_batch_from=0)
