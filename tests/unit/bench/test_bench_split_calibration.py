"""The bench's measured decode split: the pure conversion of two slices' timings into a
``DecodeWork``, and the timing itself on a real llama.cpp engine (tiny synthetic model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import DecodeWork, decode_work, describe_model
from meshnet.bench.split_calibration import calibrate, calibrated_work
from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.engine.llama_config import LlamaConfig

# Thirty equal blocks and a tail counted as six of them: weight elements split 0:18 / 18:30.
COUNTED = DecodeWork((100,) * 30, 600)


def test_a_tail_cheaper_than_counted_moves_layers_onto_it() -> None:
    # The head's 18 blocks take 3.6 ms (0.2 ms a block); the tail's 12 take 2.4 ms of its 2.8 ms,
    # so its LM head costs 0.4 ms: two blocks' worth, not six.
    work = calibrated_work(COUNTED, 18, head_ms=3.6, tail_ms=2.8)
    assert work == DecodeWork(COUNTED.layers, 200)
    assert COUNTED.split(2) == [LayerRange(0, 18), LayerRange(18, 30)]
    assert work.split(2) == [LayerRange(0, 16), LayerRange(16, 30)]  # 16 blocks vs 14 + 2


def test_a_tail_dearer_than_counted_moves_layers_off_it() -> None:
    work = calibrated_work(COUNTED, 18, head_ms=3.6, tail_ms=4.8)  # LM head: 2.4 ms = 12 blocks
    assert work.tail == 1200 and work.split(2) == [LayerRange(0, 21), LayerRange(21, 30)]


def test_a_tail_faster_than_its_blocks_adds_nothing() -> None:
    assert calibrated_work(COUNTED, 18, head_ms=3.6, tail_ms=1.0).tail == 0


@pytest.mark.parametrize(
    ("cut", "head_ms", "tail_ms"), [(0, 1.0, 1.0), (30, 1.0, 1.0), (18, 0.0, 1.0), (18, 1.0, -1.0)]
)
def test_impossible_measurements_are_refused(cut: int, head_ms: float, tail_ms: float) -> None:
    with pytest.raises(InvalidArgument):
        calibrated_work(COUNTED, cut, head_ms=head_ms, tail_ms=tail_ms)


def test_the_engine_times_both_slices_at_the_position(tiny_model: Path, tmp_path: Path) -> None:
    counted = decode_work(tiny_model)
    llama = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=64, max_batch_tokens=32)
    measured = calibrate(
        describe_model(tiny_model), counted, SliceCache(tmp_path / "cache"), llama, position=70, sessions=3
    )
    assert measured.cut == counted.split(2)[0].stop and measured.position == 70
    assert measured.head_ms > 0 and measured.tail_ms > 0
    assert measured.work.layers == counted.layers
    assert measured.work == calibrated_work(counted, measured.cut, head_ms=measured.head_ms, tail_ms=measured.tail_ms)
    ranges, elements = measured.work.split(2), counted.split(2)
    line = measured.describe(elements, ranges)
    assert line.startswith(f"decode split {', '.join(map(str, ranges))} from measured cost a row at position 70 ")
    assert line.endswith(f"weight elements alone would split {', '.join(map(str, elements))}")
