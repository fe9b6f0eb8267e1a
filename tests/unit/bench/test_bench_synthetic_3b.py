"""The ``--synthetic-3b`` preset: which lanes it measures, on which model, with what KV."""

from __future__ import annotations

from pathlib import Path

from meshnet.artifact.synthetic_models import SYNTHETIC_3B, synthetic_model_path
from meshnet.bench.config import BenchConfig, parse_lane
from meshnet.bench.synthetic_3b import synthetic_3b_config


def test_preset_runs_one_stream_of_whole_and_two_routes_plus_llama_rpc(tmp_path: Path) -> None:
    # A file already at the model's path stands in for it: the preset must not rewrite 1.9 GB.
    model = synthetic_model_path(tmp_path / "models", SYNTHETIC_3B)
    model.parent.mkdir()
    model.write_bytes(b"placeholder")
    base = BenchConfig(model=tmp_path / "other.gguf", data_dir=tmp_path)
    config = synthetic_3b_config(base, tmp_path)
    assert config.model == model and model.read_bytes() == b"placeholder"
    assert config.synthetic_3b and config.extra_lanes == ("llama-rpc-3",)
    assert [str(lane) for lane in config.lane_names()] == ["llama-whole", "meshnet-2", "meshnet-3"]
    assert config.concurrency == (1,) and config.max_slots == 1
    assert all(config.measures(parse_lane(lane), 1) for lane in config.lanes)
    assert config.contexts == () and config.prefill_prompt_tokens == 0
