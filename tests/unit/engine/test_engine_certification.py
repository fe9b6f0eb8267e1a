"""Start-up certification passes on this llama.cpp build (and on the fake engine), refuses when split
output differs, and reports digests every node of a recipe shares."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import ModelDescription, describe_model
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.cli import main as cli
from meshnet.core.errors import CertificationFailed, MeshnetError, SnapshotRefused
from meshnet.core.layers import LayerRange
from meshnet.engine import certification
from meshnet.engine.backend import StepInput, StepOutput
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig


def test_certification_passes_on_the_pinned_build() -> None:
    report = certification.certify_llama_engine()
    assert report.backend_version
    # + batched decode, + isolation under KV churn, + KV exported and imported back
    assert len(report.checks) == len(certification.PROMPTS) + 3
    assert any("batched" in check for check in report.checks)


def test_certify_command_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["certify"]) == 0
    assert "certified" in capsys.readouterr().out


def test_certification_refuses_a_split_that_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Shards cut from a model with other weights stand in for a build that computes splits wrongly.
    genuine = certification.open_llama_shard

    def open_shard(
        source: ModelDescription, layers: LayerRange, cache: SliceCache, config: LlamaConfig
    ) -> LlamaBackend:
        if layers == LayerRange(0, 4):
            return genuine(source, layers, cache, config)
        other = write_synthetic_model(source.path.with_name("other.gguf"), SyntheticSpec(seed=1))
        return genuine(describe_model(other), layers, cache, config)

    monkeypatch.setattr(certification, "open_llama_shard", open_shard)
    with pytest.raises(
        CertificationFailed, match="prefill logits, prompt 0: split output differs from the whole model"
    ):
        certification.certify_llama_engine()


def test_certification_refuses_when_slices_do_not_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> LlamaBackend:
        raise MeshnetError("simulated load failure")

    monkeypatch.setattr(certification, "open_llama_shard", broken)
    with pytest.raises(CertificationFailed, match="do not load on this build: simulated load failure"):
        certification.certify_llama_engine()


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen3moe", "gemma3"])
def test_certification_covers_the_served_family_and_weight_types(family: str, tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType as Quant

    served = write_synthetic_model(
        tmp_path / "served.gguf",
        SyntheticSpec(architecture=family, weight_type=Quant.Q4_K, embedding_type=Quant.Q8_0, n_embd=256, n_ff=256),
    )
    from meshnet.artifact.certification_models import served_types

    report = certification.certify_llama_engine(model=served)
    _, weights, _ = served_types(served)
    assert "Q4_K" in report.weight_types  # (qwen3moe adds its F32 router and Q8_0 fallback rows)
    assert (report.architecture, report.weight_types, report.embedding_type) == (
        family,
        tuple(t.name for t in weights),
        "Q8_0",
    )
    for weight in report.weight_types:
        assert any(check.startswith(f"{family} {weight}: ") for check in report.checks)


def test_certification_refuses_a_model_it_cannot_cover(tmp_path: Path) -> None:
    foreign = write_synthetic_model(tmp_path / "phi3.gguf", SyntheticSpec(architecture="phi3"))
    with pytest.raises(
        CertificationFailed, match=r"cannot certify phi3\.gguf.*'phi3' has no certified meshnet adapter"
    ):
        certification.certify_llama_engine(model=foreign)


def test_certification_of_a_q4_0_model_loaded_without_repacking(tmp_path: Path) -> None:
    """A --no-repack worker certifies the kernels it serves with: slices loaded without repacking."""
    from gguf import GGMLQuantizationType as Quant

    served = write_synthetic_model(tmp_path / "served.gguf", SyntheticSpec(weight_type=Quant.Q4_0))
    report = certification.certify_llama_engine(model=served, repack=False)
    assert "Q4_0" in report.weight_types
    assert any(check.startswith("llama Q4_0: ") for check in report.checks)


def test_the_report_digests_every_compared_logit_and_is_the_same_on_every_run(tmp_path: Path) -> None:
    # What the tracker compares across the nodes of a recipe: deterministic models on a pinned
    # build give one whole-model digest; another family's models give another.
    report, again = certification.certify_llama_engine(), certification.certify_llama_engine()
    assert report.whole_sha256 == report.split_sha256 == again.whole_sha256
    qwen2 = write_synthetic_model(tmp_path / "qwen2.gguf", SyntheticSpec(architecture="qwen2", tied_embeddings=False))
    assert certification.certify_llama_engine(model=qwen2).whole_sha256 != report.whole_sha256
    bound = report.bound_to("rcp-" + "0" * 32)
    assert bound.digest == bound.recomputed_digest and bound.checks == report.checks


def test_the_fake_engine_certifies_like_the_real_one() -> None:
    report = certification.certify_fake_engine(6, 16, 64)
    assert report.whole_sha256 == report.split_sha256 == certification.certify_fake_engine(6, 16, 64).whole_sha256
    assert len(report.checks) == len(certification.PROMPTS) + 3
    assert certification.certify_fake_engine(6, 32, 64).whole_sha256 != report.whole_sha256
    with pytest.raises(CertificationFailed, match="cannot be split"):
        certification.certify_fake_engine(1, 16, 64)


def test_the_fake_certification_refuses_a_fake_whose_split_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    class Drifting(certification.FakeBackend):  # type: ignore[misc]
        """A fake whose later shards compute something else than the whole model's layers."""

        def run(self, batch: list[StepInput]) -> list[StepOutput]:
            outputs = super().run(batch)
            if self.shape.layers.start == 0:
                return outputs
            return [replace(out, logits=None if out.logits is None else out.logits + 1e-3) for out in outputs]

    monkeypatch.setattr(certification, "FakeBackend", Drifting)
    with pytest.raises(CertificationFailed, match="split output differs from the whole model"):
        certification.certify_fake_engine(6, 16, 64)


def test_certification_refuses_a_build_whose_kv_does_not_import_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise SnapshotRefused("simulated: llama.cpp did not load the state")

    monkeypatch.setattr(LlamaBackend, "import_slot", refuse)
    with pytest.raises(CertificationFailed, match="does not export and import back on this build: simulated"):
        certification.certify_llama_engine()


def test_certification_refuses_a_restore_that_is_not_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    class Lossy(certification.FakeBackend):  # type: ignore[misc]
        """A fake whose exported KV flips a low bit of one value (and loads back)."""

        def export_slot(self, slot: int) -> bytes:
            blob = bytearray(super().export_slot(slot))
            blob[-3] ^= 1  # a mantissa bit of the last float64, well above float32 rounding
            return bytes(blob)

    monkeypatch.setattr(certification, "FakeBackend", Lossy)
    with pytest.raises(CertificationFailed, match="prefill after a KV restore: split output differs"):
        certification.certify_fake_engine(6, 16, 64)


def test_certification_compares_bits_not_values() -> None:
    """-0.0 == 0.0 as values; a split that flips a zero's sign is not bit-identical and fails."""
    whole = np.zeros((1, 8), np.float32)
    split = whole.copy()
    split[0, 3] = -0.0
    certification._require(whole, whole.copy(), "same bits")
    with pytest.raises(CertificationFailed, match="signed zeros or NaNs"):
        certification._require(whole, split, "signed zero")
