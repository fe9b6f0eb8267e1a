"""The transformers lanes without their extra: skipped with the reason, a typed error, no numbers;
and the lane's arithmetic (tok/s, per-prompt agreement) on hand-made generations."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from bench_samples import sample_results

from meshnet.bench import transformers_lane
from meshnet.bench.config import BenchConfig
from meshnet.bench.extra_lanes import measure_extra_lanes
from meshnet.bench.results import ExtraLane, from_json, to_json
from meshnet.bench.results_file import schema_problems
from meshnet.bench.stats import RequestTrace, RunRecord
from meshnet.bench.torch_baseline import (
    BaselineModel,
    BaselineUnavailable,
    Generated,
    import_baseline,
    require_recompute_route,
)
from meshnet.bench.transformers_lane import measure_transformers, transformers_result
from meshnet.core.errors import FailedPrecondition


@pytest.fixture
def without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch as a missing package, in this venv or the baseline one (a None entry makes import fail)."""
    monkeypatch.setitem(sys.modules, "torch", None)


def _config(tmp_path: Path) -> BenchConfig:
    return BenchConfig(model=tmp_path / "absent.gguf", data_dir=tmp_path, extra_lanes=("transformers",))


def test_a_missing_torch_is_a_typed_error_that_says_what_to_install(without_torch: None) -> None:
    with pytest.raises(BaselineUnavailable) as raised:
        import_baseline()
    assert isinstance(raised.value, FailedPrecondition)
    assert raised.value.code == "baseline_unavailable"
    assert raised.value.message.startswith("baseline unavailable: torch is not installed")
    assert "pip install .[baseline]" in raised.value.message
    with pytest.raises(BaselineUnavailable):
        BaselineModel(Path("/nonexistent.gguf"), threads=1)


def test_without_the_extra_both_lanes_are_skipped_with_the_reason(without_torch: None, tmp_path: Path) -> None:
    lanes = asyncio.run(measure_extra_lanes(_config(tmp_path), lambda _: None))
    assert set(lanes) == {"transformers-whole", "transformers-recompute-3"}
    for lane in lanes.values():
        assert lane.skipped is not None and lane.skipped.startswith("baseline unavailable: torch is not installed")
        assert (lane.decode_tok_s, lane.whole_decode_tok_s, lane.vs_whole, lane.token_agreement) == (None,) * 4


def test_skipped_lanes_fit_the_results_schema(without_torch: None, tmp_path: Path) -> None:
    lanes = measure_transformers(_config(tmp_path), lambda _: None)
    document = to_json(replace(from_json(sample_results()), extra_lanes=lanes))
    assert schema_problems(document) == []
    assert "token_agreement_per_prompt" not in document["extra_lanes"]["transformers-whole"]


def _generated(tokens: tuple[int, ...], start: float, gap: float) -> Generated:
    return Generated(start, tokens, tuple(start + 0.5 + gap * i for i in range(len(tokens))))


def _reference(streams: list[tuple[tuple[int, ...], float]]) -> RunRecord:
    traces = tuple(
        RequestTrace(index, 4, 0.0, tuple(1.0 + gap * i for i in range(len(tokens))), tokens, 9.0)
        for index, (tokens, gap) in enumerate(streams)
    )
    return RunRecord(1, 0.0, 9.0, traces)


def test_rates_and_per_prompt_agreement_against_llama() -> None:
    reference = _reference([((1, 2, 3, 4, 5), 0.01), ((6, 7, 8, 9, 10), 0.01)])  # 100 tok/s each
    runs = [_generated((1, 2, 3, 4, 5), 10.0, 0.1), _generated((6, 7, 0, 0, 10), 20.0, 0.05)]
    lane = transformers_result(runs, reference, "note")
    assert lane.decode_tok_s == pytest.approx(15.0)  # median of 10 and 20 tok/s
    assert lane.whole_decode_tok_s == pytest.approx(100.0)
    assert lane.vs_whole == pytest.approx(0.15)
    assert lane.token_agreement_per_prompt == pytest.approx((1.0, 0.6))
    assert lane.token_agreement == pytest.approx(0.8)  # 8 of 10 positions
    assert lane.skipped is None


def test_the_recompute_route_refuses_every_family_but_llama() -> None:
    require_recompute_route("llama")
    for model_type in ("gemma3", "qwen2", "mistral"):
        with pytest.raises(BaselineUnavailable, match=repr(model_type)):
            require_recompute_route(model_type)


class _StandIn:
    """A stand-in for ``BaselineModel`` (no torch here): the lane's control flow around it is
    what is under test, not the model. Each generate method fails as told."""

    n_layers = 30
    versions = "torch 0.0+test, transformers 0.0+test"

    def __init__(self, cached_error: Exception | None, recompute_error: Exception | None) -> None:
        self._cached_error, self._recompute_error = cached_error, recompute_error

    def close(self) -> None:
        pass

    def generate_cached(self, prompt: tuple[int, ...], max_tokens: int) -> Generated:
        if self._cached_error is not None:
            raise self._cached_error
        return _generated(prompt[:1] * max_tokens, 1.0, 0.1)

    def generate_recompute(self, prompt: tuple[int, ...], max_tokens: int, stages: object) -> Generated:
        if self._recompute_error is not None:
            raise self._recompute_error
        return _generated(prompt[:1] * max_tokens, 1.0, 0.2)


def _lanes_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: _StandIn) -> dict[str, ExtraLane]:
    monkeypatch.setattr(transformers_lane, "BaselineModel", lambda path, threads: model)
    reference = _reference([((5,) * 4, 0.01), ((6,) * 4, 0.01)])
    monkeypatch.setattr(transformers_lane, "llama_reference", lambda config, tokens: ([(5, 1), (6, 1)], reference))
    config = replace(_config(tmp_path), output_tokens=4)
    return transformers_lane.measure_transformers(config, lambda _: None)


def test_a_crash_in_the_recompute_route_skips_that_lane_and_keeps_the_whole_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # What Gemma 3 raised before the route refused it: the bench used to abort after every lane ran.
    crash = TypeError("Gemma3RotaryEmbedding.forward() missing 1 required positional argument: 'layer_type'")
    lanes = _lanes_with(monkeypatch, tmp_path, _StandIn(None, crash))
    assert lanes["transformers-recompute-3"].skipped == f"transformers-recompute-3 failed: TypeError: {crash}"
    assert lanes["transformers-whole"].skipped is None
    assert lanes["transformers-whole"].token_agreement == pytest.approx(1.0)


def test_a_refused_family_skips_recompute_with_the_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    refusal = BaselineUnavailable("baseline unavailable: the recompute route calls llama's decoder layers")
    lanes = _lanes_with(monkeypatch, tmp_path, _StandIn(None, refusal))
    assert lanes["transformers-recompute-3"].skipped == refusal.message
    assert lanes["transformers-whole"].decode_tok_s == pytest.approx(10.0)
    assert lanes["transformers-whole"].note.endswith("; torch 0.0+test, transformers 0.0+test")


def test_a_crash_in_the_whole_lane_skips_both(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lanes = _lanes_with(monkeypatch, tmp_path, _StandIn(RuntimeError("out of memory"), None))
    assert {name: lane.skipped for name, lane in lanes.items()} == {
        "transformers-whole": "transformers-whole failed: RuntimeError: out of memory",
        "transformers-recompute-3": "transformers-whole failed: RuntimeError: out of memory",
    }
