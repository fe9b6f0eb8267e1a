"""Start-up certification of expert parallelism passes on this build and can fail."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Quant

from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.errors import CertificationFailed
from meshnet.engine.llama_config import LlamaConfig
from meshnet.moe import certification as moe_certification
from meshnet.moe.certification import certify_expert_parallel
from meshnet.moe.ownership import ExpertOwnership

MOE = SyntheticSpec(architecture="qwen3moe", n_layers=2, n_expert=8, n_expert_used=2, weight_type=Quant.Q4_0)


def test_certifies_the_served_family_and_types(tmp_path: Path) -> None:
    checks = certify_expert_parallel(write_synthetic_model(tmp_path / "moe.gguf", MOE), 4)
    # The router is F32, so an F32 model is certified beside the Q4_0 one.
    assert [c.split(":")[0] for c in checks] == [f"qwen3moe {t} {n} nodes" for t in ("F32", "Q4_0") for n in (2, 4)]


def test_refuses_a_dense_model(tmp_path: Path) -> None:
    with pytest.raises(CertificationFailed, match="expert"):
        certify_expert_parallel(write_synthetic_model(tmp_path / "dense.gguf", SyntheticSpec()), 2)


def test_a_shared_dummy_expert_fails_certification(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One dummy for all of a token's non-local slots overflows the repacked Q4_0 kernel's
    per-expert row list (sized for one row per token) and corrupts a local expert's rows:
    exactly the kind of build behaviour the gate must catch."""

    def shared(self: ExpertOwnership, n_expert: int, n_expert_used: int) -> np.ndarray:
        return np.full(n_expert_used, (self.index + 1) % self.count, np.int32)

    monkeypatch.setattr(ExpertOwnership, "dummy_experts", shared)
    with pytest.raises(CertificationFailed, match="differs from the whole model"):
        certify_expert_parallel(write_synthetic_model(tmp_path / "moe.gguf", MOE), 2)


@pytest.mark.parametrize("repack", [True, False])
def test_certification_loads_as_the_node_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repack: bool) -> None:
    """Whole and group load with the served repack setting (it picks the Q4_0 kernels): the shared
    dummy above breaks only the repacked kernel, so it fails certification with repacking on and
    goes unnoticed without it, the kernel those nodes run."""

    def shared(self: ExpertOwnership, n_expert: int, n_expert_used: int) -> np.ndarray:
        return np.full(n_expert_used, (self.index + 1) % self.count, np.int32)

    monkeypatch.setattr(ExpertOwnership, "dummy_experts", shared)
    model = write_synthetic_model(tmp_path / "moe.gguf", MOE)
    served = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=64, max_batch_tokens=8, repack=repack)
    if repack:
        with pytest.raises(CertificationFailed, match="differs from the whole model"):
            certify_expert_parallel(model, 2, served)
    else:
        assert len(certify_expert_parallel(model, 2, served)) == 2  # F32 and Q4_0, 2 nodes


def test_the_group_is_compared_by_bits() -> None:
    """The same comparison as the engine's certification (``engine.bitwise``): a NaN reproduced
    exactly passes, one with another payload does not."""
    whole = np.array([[0.5, np.nan]], np.float32)
    moe_certification._require(whole, whole.copy(), "same NaN")
    other = whole.copy()
    other.view(np.uint32)[0, 1] = 0x7FC00001
    with pytest.raises(CertificationFailed, match="signed zeros or NaNs"):
        moe_certification._require(whole, other, "other NaN payload")
