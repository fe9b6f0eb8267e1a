"""Where a pipelined route's layers split: each shard about as busy as the others, the LM head
counted on the tail; and the work a GGUF header says each part of the model does per token."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from meshnet.artifact.describe import decode_work
from meshnet.artifact.gguf_file import parse_gguf
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange, split_by_work, split_evenly


def busiest(work: list[float], ranges: list[LayerRange], tail: float) -> float:
    return max(sum(work[r.start : r.stop]) + (tail if r.stop == len(work) else 0.0) for r in ranges)


def test_equal_work_splits_evenly() -> None:
    for n_layers, shards in ((30, 2), (30, 3), (22, 3), (4, 4)):
        ranges = split_by_work([1.0] * n_layers, shards)
        assert sorted(map(len, ranges)) == sorted(map(len, split_evenly(n_layers, shards)))


def test_a_heavy_lm_head_moves_layers_off_the_tail() -> None:
    # SmolLM2-135M's shape: 3.54 M elements a block, a 28.3 M-element tied LM head.
    ranges = split_by_work([3.54] * 30, 2, tail_work=28.3)
    assert ranges == [LayerRange(0, 19), LayerRange(19, 30)]
    assert busiest([3.54] * 30, ranges, 28.3) < busiest([3.54] * 30, split_evenly(30, 2), 28.3)


def test_no_other_split_has_a_less_busy_shard() -> None:
    work = [1.0, 5.0, 2.0, 2.0, 7.0, 1.0, 1.0, 3.0]
    ranges = split_by_work(work, 3, tail_work=4.0)
    best = busiest(work, ranges, 4.0)
    for a in range(1, 7):
        for b in range(a + 1, 8):
            other = [LayerRange(0, a), LayerRange(a, b), LayerRange(b, 8)]
            assert best <= busiest(work, other, 4.0)
    assert ranges[0].start == 0 and ranges[-1].stop == 8
    assert all(x.stop == y.start for x, y in itertools.pairwise(ranges))


def core_loads(work: list[float], ranges: list[LayerRange], tail: float, cores: list[int]) -> dict[int, float]:
    loads: dict[int, float] = {}
    for core, r in zip(cores, ranges, strict=True):
        loads[core] = loads.get(core, 0.0) + sum(work[r.start : r.stop]) + (tail if r.stop == len(work) else 0.0)
    return loads


def test_shards_sharing_a_core_are_balanced_together() -> None:
    # Three processes on two cores (head and tail on core 0): no split loads the busier core less.
    work, tail, cores = [3.54] * 30, 28.3, [0, 1, 0]
    ranges = split_by_work(work, 3, tail_work=tail, cores=cores)
    best = max(core_loads(work, ranges, tail, cores).values())
    for a in range(1, 29):
        for b in range(a + 1, 30):
            other = [LayerRange(0, a), LayerRange(a, b), LayerRange(b, 30)]
            assert best <= max(core_loads(work, other, tail, cores).values()) + 1e-9
    # The per-shard balance would leave core 0 with two shards' worth of work.
    per_shard = split_by_work(work, 3, tail_work=tail)
    assert best < max(core_loads(work, per_shard, tail, cores).values())
    assert ranges[0].start == 0 and ranges[-1].stop == 30
    assert all(x.stop == y.start for x, y in itertools.pairwise(ranges))


def test_a_core_for_every_shard_splits_as_without_cores() -> None:
    work = [1.0, 5.0, 2.0, 2.0, 7.0, 1.0, 1.0, 3.0]
    assert split_by_work(work, 3, tail_work=4.0, cores=[0, 1, 2]) == split_by_work(work, 3, tail_work=4.0)


def test_impossible_splits_are_refused() -> None:
    with pytest.raises(InvalidArgument):
        split_by_work([1.0] * 4, 2, cores=[0])
    with pytest.raises(InvalidArgument):
        split_by_work([1.0] * 400, 8, cores=[0, 1] * 4)  # too many splits to try one by one
    with pytest.raises(InvalidArgument):
        split_by_work([1.0] * 3, 4)
    with pytest.raises(InvalidArgument):
        split_by_work([1.0] * 3, 0)
    with pytest.raises(InvalidArgument):
        split_by_work([1.0, -1.0], 2)


@pytest.mark.parametrize("tied", [True, False])
def test_decode_work_counts_the_lm_head_on_the_tail(
    synthetic_model_factory: Callable[[SyntheticSpec], Path], tied: bool
) -> None:
    path = synthetic_model_factory(SyntheticSpec(n_layers=6, tied_embeddings=tied))
    work = decode_work(path)
    gguf = parse_gguf(path)
    head = gguf.tensors["token_embd.weight" if tied else "output.weight"]
    assert len(work.layers) == 6 and len(set(work.layers)) == 1 and work.layers[0] > 0
    assert work.tail == head.n_elements + gguf.tensors["output_norm.weight"].n_elements
    assert work.split(2) == split_by_work(work.layers, 2, tail_work=work.tail)
    assert work.split(3, [0, 1, 0]) == split_by_work(work.layers, 3, tail_work=work.tail, cores=[0, 1, 0])


def test_a_prompt_splits_by_its_layers_alone(synthetic_model_factory: Callable[[SyntheticSpec], Path]) -> None:
    # A prompt's rows run every block; the LM head runs for its last row only.
    work = decode_work(synthetic_model_factory(SyntheticSpec(n_layers=6)))
    assert work.prefill_split(2) == split_evenly(6, 2)
    assert work.prefill_split(3) == split_evenly(6, 3)
