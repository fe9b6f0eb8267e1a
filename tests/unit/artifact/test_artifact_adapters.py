"""Architecture adapters fail closed with named errors, and rewrite per-layer metadata per slice."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from meshnet.artifact import architectures
from meshnet.artifact.architectures import adapter_for, known_architectures
from meshnet.artifact.architectures.gemma3 import GEMMA3
from meshnet.artifact.describe import describe_model
from meshnet.artifact.gguf_file import parse_gguf
from meshnet.artifact.slicing import verify_slice, write_embedding_table, write_slice
from meshnet.artifact.synthetic import FAMILIES, SyntheticSpec
from meshnet.core.errors import LayerMetadataMismatch, UnsupportedArchitecture, UnsupportedModelVariant
from meshnet.core.layers import LayerRange

Make = Callable[[SyntheticSpec], Path]


def test_the_registry_is_exactly_the_certified_families() -> None:
    assert known_architectures() == tuple(sorted(FAMILIES))
    for family in FAMILIES:
        assert adapter_for(family).name == family
    with pytest.raises(UnsupportedArchitecture, match="'deepseek2' has no certified meshnet adapter"):
        adapter_for("deepseek2")


def test_describe_names_the_adapter_and_its_version(synthetic_model_factory: Make) -> None:
    description = describe_model(synthetic_model_factory(SyntheticSpec(architecture="qwen3moe")))
    assert (description.architecture, description.adapter_version) == ("qwen3moe", adapter_for("qwen3moe").version)


def test_an_architecture_outside_the_registry_is_refused_everywhere(
    synthetic_model_factory: Make, tmp_path: Path
) -> None:
    source = synthetic_model_factory(SyntheticSpec(architecture="phi3"))
    for attempt in (
        lambda: describe_model(source),
        lambda: write_slice(source, LayerRange(0, 2), tmp_path / "s.gguf"),
        lambda: write_embedding_table(source, tmp_path / "e.gguf"),
    ):
        with pytest.raises(UnsupportedArchitecture, match="phi3"):
            attempt()
    assert list(tmp_path.iterdir()) == []


def test_a_gemma3_27b_shaped_model_is_refused(synthetic_model_factory: Make, tmp_path: Path) -> None:
    source = synthetic_model_factory(SyntheticSpec(architecture="gemma3", n_layers=62, n_embd=32, n_ff=32, seed=3))
    with pytest.raises(UnsupportedModelVariant, match="27B"):
        describe_model(source)
    with pytest.raises(UnsupportedModelVariant, match="27B"):
        write_slice(source, LayerRange(0, 31), tmp_path / "s.gguf")
    assert list(tmp_path.iterdir()) == []


def test_a_62_layer_slice_of_a_larger_gemma3_is_refused(synthetic_model_factory: Make, tmp_path: Path) -> None:
    source = synthetic_model_factory(SyntheticSpec(architecture="gemma3", n_layers=63, n_embd=32, n_ff=32, seed=4))
    with pytest.raises(UnsupportedModelVariant, match="62 layers"):
        write_slice(source, LayerRange(1, 63), tmp_path / "s.gguf")
    write_slice(source, LayerRange(2, 63), tmp_path / "ok.gguf")  # 61 layers are fine


def test_a_slice_whose_per_layer_arrays_miss_its_block_count_is_refused(
    synthetic_model_factory: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = synthetic_model_factory(SyntheticSpec(architecture="qwen2", n_layers=4, per_layer_arrays=True))
    # An adapter that forgets to cut per-layer arrays (the llama adapter before version 2) writes
    # an internally consistent slice whose arrays still hold 4 entries for 2 blocks.
    forgetful = replace(adapter_for("qwen2"), per_layer_keys=())
    monkeypatch.setitem(architectures._REGISTRY, "qwen2", forgetful)
    write_slice(source, LayerRange(0, 2), tmp_path / "bad.gguf")
    monkeypatch.undo()
    with pytest.raises(LayerMetadataMismatch, match=r"qwen2.feed_forward_length holds 4 per-layer values .* 2 blocks"):
        verify_slice(tmp_path / "bad.gguf")


def test_per_layer_arrays_are_cut_to_the_slice(synthetic_model_factory: Make, tmp_path: Path) -> None:
    source = synthetic_model_factory(SyntheticSpec(architecture="qwen3moe", n_layers=4, per_layer_arrays=True))
    write_slice(source, LayerRange(1, 4), tmp_path / "s.gguf")
    sliced = parse_gguf(tmp_path / "s.gguf")
    for key in ("attention.head_count", "feed_forward_length", "expert_used_count", "expert_feed_forward_length"):
        assert len(sliced.require(f"qwen3moe.{key}")) == 3, key


def test_an_unknown_tensor_in_a_certified_family_is_refused(synthetic_model_factory: Make) -> None:
    source = parse_gguf(synthetic_model_factory(SyntheticSpec(architecture="qwen3")))
    adapter = adapter_for("qwen3")
    adapter.check_tensors(list(source.tensors), "ok")
    with pytest.raises(UnsupportedModelVariant, match=r"cls\.output\.weight"):
        adapter.check_tensors([*source.tensors, "cls.output.weight"], "reranker.gguf")
    with pytest.raises(UnsupportedModelVariant, match=r"blk\.0\.ffn_gate_shexp"):
        adapter.check_tensors([*source.tensors, "blk.0.ffn_gate_shexp.weight"], "shared-experts.gguf")


@pytest.mark.parametrize(
    ("layers", "windowed"),
    [
        (LayerRange(0, 7), [True] * 5 + [False, True]),
        (LayerRange(3, 7), [True, True, False, True]),  # off the period: layer 5 stays global
        (LayerRange(5, 6), None),  # no windowed layer: windowing is switched off for the slice
    ],
)
def test_gemma3_slices_carry_their_own_layers_window_flags(
    synthetic_model_factory: Make, tmp_path: Path, layers: LayerRange, windowed: list[bool] | None
) -> None:
    source = synthetic_model_factory(SyntheticSpec(architecture="gemma3", n_layers=7, head_dim=32))
    assert GEMMA3.windowed_layers(parse_gguf(source).metadata, 7) == [True] * 5 + [False, True]
    write_slice(source, layers, tmp_path / "s.gguf")
    sliced = parse_gguf(tmp_path / "s.gguf")
    if windowed is None:
        assert sliced.get("gemma3.attention.sliding_window") is None
        assert sliced.get("gemma3.attention.sliding_window_pattern") is None
    else:
        assert sliced.require("gemma3.attention.sliding_window_pattern") == windowed
        assert sliced.require("gemma3.attention.sliding_window") == 8


def test_gemma3_reads_a_per_layer_window_array_and_checks_its_length(synthetic_model_factory: Make) -> None:
    pattern = (False, True, True, False)
    source = parse_gguf(synthetic_model_factory(SyntheticSpec(architecture="gemma3", window_pattern=pattern)))
    assert GEMMA3.windowed_layers(source.metadata, 4) == list(pattern)
    with pytest.raises(LayerMetadataMismatch, match="sliding_window_pattern holds 4"):
        GEMMA3.check_layer_metadata(source.metadata, 5, "x.gguf")
