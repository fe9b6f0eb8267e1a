"""The concurrency sweep's configuration: the whole-model thread lanes' names and the preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet.bench.config import BenchConfig, LaneName, parse_lane, sweep_config
from meshnet.core.errors import InvalidArgument


@pytest.mark.parametrize(
    ("text", "lane"),
    [
        ("llama-whole-2-threads", LaneName("llama-whole", 1, 2)),
        ("llama-whole-1-thread", LaneName("llama-whole", 1, 1)),
        ("llama-whole", LaneName("llama-whole", 1)),
        ("meshnet-2", LaneName("meshnet", 2)),
    ],
)
def test_lane_names_read_back_as_written(text: str, lane: LaneName) -> None:
    assert parse_lane(text) == lane and str(lane) == text


@pytest.mark.parametrize(
    "text", ["llama-whole-0-threads", "llama-whole-2-thread", "llama-whole-1-threads", "split-2-threads"]
)
def test_other_spellings_fail_loudly(text: str) -> None:
    with pytest.raises(InvalidArgument, match="llama-whole-T-threads"):
        parse_lane(text)


def test_a_two_thread_lane_gets_two_llama_threads_and_the_rest_keep_the_bench_threads() -> None:
    config = BenchConfig(model=Path("m.gguf"), data_dir=Path("d"), lanes=("llama-whole", "llama-whole-2-threads"))
    assert config.llama_config().n_threads == 1
    assert config.llama_config(threads=2).n_threads == 2


def test_the_sweep_preset_measures_its_lanes_at_every_concurrency_and_keeps_the_others() -> None:
    config = sweep_config(BenchConfig(model=Path("m.gguf"), data_dir=Path("d")))
    assert config.concurrency == (1, 2, 4, 8, 16) and config.max_slots == 16 and config.pin_workers
    assert config.lanes[-1] == "llama-whole-2-threads" and "meshnet-3" in config.lanes
    for lane in ("llama-whole", "llama-whole-2-threads", "meshnet-2"):
        assert all(config.measures(parse_lane(lane), k) for k in config.concurrency)
    # A lane outside the sweep stays at the run's own lane concurrencies (1 and 4 by default).
    assert [k for k in config.concurrency if config.measures(parse_lane("meshnet-3"), k)] == [1, 4]
