"""Range slices of synthetic models: roles, renumbered blocks, vocabulary-free heads and middles,
tails that keep the LM head, and provenance that is recorded, verified and catches tampering."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from artifact_slice_samples import CASES, SPECS, flip_byte, tensor_bytes

from meshnet.artifact.gguf_file import GGUFFile, parse_gguf
from meshnet.artifact.hashing import file_sha256
from meshnet.artifact.slicing import SLICER_VERSION, Provenance, SliceRole, read_provenance, verify_slice, write_slice
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.errors import ProvenanceMismatch
from meshnet.core.layers import LayerRange

SliceResult = tuple[GGUFFile, GGUFFile, Provenance]
Case = tuple[str, LayerRange, SliceRole]


@pytest.fixture(scope="module")
def cut(
    synthetic_model_factory: Callable[[SyntheticSpec], Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, LayerRange], SliceResult]:
    """``cut(spec_name, layers) -> (source, slice, provenance)``, each slice written once."""
    folder = tmp_path_factory.mktemp("slices")
    done: dict[tuple[str, LayerRange], SliceResult] = {}

    def make(name: str, layers: LayerRange) -> SliceResult:
        if (name, layers) not in done:
            source = synthetic_model_factory(SPECS[name])
            out = folder / f"{name}-{layers.start}-{layers.stop}.gguf"
            provenance = write_slice(source, layers, out)
            done[name, layers] = (parse_gguf(source), parse_gguf(out), provenance)
        return done[name, layers]

    return make


def _case_id(case: Case) -> str:
    return f"{case[0]}-{case[1]}-{case[2]}"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_slice_holds_exactly_its_blocks_renumbered(cut: Callable[[str, LayerRange], SliceResult], case: Case) -> None:
    name, layers, role = case
    source, sliced, provenance = cut(name, layers)
    assert provenance.role == role
    assert sliced.get("llama.block_count") == len(layers)
    block_names = {t for t in sliced.tensors if t.startswith("blk.")}
    expected = {
        f"blk.{int(t.split('.')[1]) - layers.start}.{t.split('.', 2)[2]}"
        for t in source.tensors
        if t.startswith("blk.") and int(t.split(".")[1]) in layers
    }
    assert block_names == expected
    assert {int(t.split(".")[1]) for t in block_names} == set(range(len(layers)))
    for renamed in block_names:
        index, rest = renamed.split(".", 2)[1:]
        original = f"blk.{int(index) + layers.start}.{rest}"
        assert sliced.tensors[renamed].shape == source.tensors[original].shape
        assert sliced.tensors[renamed].ggml_type == source.tensors[original].ggml_type
        assert tensor_bytes(sliced, renamed) == tensor_bytes(source, original), renamed


@pytest.mark.parametrize("case", [c for c in CASES if c[2] in ("head", "middle")], ids=_case_id)
def test_head_and_middle_hold_no_vocabulary_sized_tensor(
    cut: Callable[[str, LayerRange], SliceResult], case: Case
) -> None:
    name, layers, _ = case
    source, sliced, _ = cut(name, layers)
    n_vocab = len(source.get("tokenizer.ggml.tokens"))
    n_embd = source.get("llama.embedding_length")
    largest_block = max(t.n_elements for t in source.tensors.values() if t.name.startswith("blk."))
    for tensor in sliced.tensors.values():
        assert n_vocab not in tensor.shape, f"{tensor.name} {tensor.shape} has a vocabulary-sized dimension"
        assert tensor.n_elements <= largest_block, tensor.name
    assert sliced.tensors["token_embd.weight"].shape == (n_embd, 1)  # llama.cpp's required placeholder
    assert "output.weight" not in sliced.tensors
    assert np.frombuffer(tensor_bytes(sliced, "output_norm.weight"), np.float32).tolist() == [1.0] * n_embd
    assert sliced.get("tokenizer.ggml.model") == "none"
    assert sliced.get("llama.vocab_size") == 1
    assert not any(k.startswith("tokenizer.") and k != "tokenizer.ggml.model" for k in sliced.metadata)
    assert sliced.file_size < source.file_size


@pytest.mark.parametrize("case", [c for c in CASES if c[2] in ("tail", "full")], ids=_case_id)
def test_tail_keeps_output_norm_lm_head_and_tokenizer(
    cut: Callable[[str, LayerRange], SliceResult], case: Case
) -> None:
    name, layers, _ = case
    source, sliced, _ = cut(name, layers)
    lm_head = "token_embd.weight" if SPECS[name].tied_embeddings else "output.weight"
    for tensor in ("output_norm.weight", lm_head, "token_embd.weight"):
        assert tensor_bytes(sliced, tensor) == tensor_bytes(source, tensor), tensor
        assert sliced.tensors[tensor].shape == source.tensors[tensor].shape
    assert ("output.weight" in sliced.tensors) == (not SPECS[name].tied_embeddings)
    for key in (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type",
        "tokenizer.chat_template",
    ):
        assert sliced.get(key) == source.get(key), key


@pytest.mark.parametrize("name", sorted(SPECS))
def test_full_slice_is_a_copy_of_the_source(cut: Callable[[str, LayerRange], SliceResult], name: str) -> None:
    n_layers = SPECS[name].n_layers
    source, sliced, provenance = cut(name, LayerRange(0, n_layers))
    assert provenance.role == "full"
    assert set(sliced.tensors) == set(source.tensors)
    for tensor in source.tensors:
        assert tensor_bytes(sliced, tensor) == tensor_bytes(source, tensor), tensor
    own = {k: v for k, v in sliced.metadata.items() if not k.startswith("meshnet.slice.")}
    assert own == {k: v for k, v in source.metadata.items() if k != "general.alignment"}


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_provenance_is_recorded_and_verifies(cut: Callable[[str, LayerRange], SliceResult], case: Case) -> None:
    name, layers, role = case
    source, sliced, provenance = cut(name, layers)
    assert read_provenance(sliced) == provenance
    assert provenance.source_sha256 == file_sha256(source.path)
    assert provenance.source_n_layers == SPECS[name].n_layers
    assert provenance.layers == layers
    assert provenance.adapter == "llama:2"
    assert provenance.slicer_version == SLICER_VERSION
    _, verified = verify_slice(sliced.path, layers=layers, source_sha256=provenance.source_sha256, role=role)
    assert verified == provenance


def test_slices_of_different_ranges_have_different_content_hashes(
    cut: Callable[[str, LayerRange], SliceResult],
) -> None:
    hashes = {cut("6L-tied-f16", r)[2].content_sha256 for r in (LayerRange(0, 2), LayerRange(2, 4), LayerRange(4, 6))}
    assert len(hashes) == 3


def _copy(sliced: GGUFFile, folder: Path) -> Path:
    return Path(shutil.copyfile(sliced.path, folder / sliced.path.name))


@pytest.mark.parametrize("which", ["first", "middle", "last"])
def test_tampered_tensor_bytes_fail_verification(
    cut: Callable[[str, LayerRange], SliceResult], tmp_path: Path, which: str
) -> None:
    _, sliced, _ = cut("6L-untied-q8_0", LayerRange(2, 4))
    copy = _copy(sliced, tmp_path)
    verify_slice(copy)  # intact copy verifies
    tensors = sorted(sliced.tensors.values(), key=lambda t: t.offset)
    tensor = {"first": tensors[0], "middle": tensors[len(tensors) // 2], "last": tensors[-1]}[which]
    flip_byte(copy, sliced.data_offset + tensor.offset + tensor.nbytes - 1)
    with pytest.raises(ProvenanceMismatch, match="do not match the recorded content hash"):
        verify_slice(copy)


def test_renamed_tensor_in_the_header_fails_verification(
    cut: Callable[[str, LayerRange], SliceResult], tmp_path: Path
) -> None:
    _, sliced, _ = cut("4L-tied-q4_1", LayerRange(2, 4))
    copy = _copy(sliced, tmp_path)
    blob = bytearray(copy.read_bytes())
    at = blob.index(b"blk.1.ffn_up.weight")
    blob[at + len("blk.1.ffn_")] = ord("x")  # blk.1.ffn_xp.weight: same length, other identity
    copy.write_bytes(bytes(blob))
    with pytest.raises(ProvenanceMismatch, match="content hash"):
        verify_slice(copy)


def test_wrong_expected_range_source_or_role_is_a_mismatch(cut: Callable[[str, LayerRange], SliceResult]) -> None:
    _, sliced, provenance = cut("6L-tied-f16", LayerRange(2, 4))
    with pytest.raises(ProvenanceMismatch, match=r"holds layers 2:4, not 2:5"):
        verify_slice(sliced.path, layers=LayerRange(2, 5))
    with pytest.raises(ProvenanceMismatch, match=r"holds layers 2:4, not 0:2"):
        verify_slice(sliced.path, layers=LayerRange(0, 2))
    with pytest.raises(ProvenanceMismatch, match="cut from source"):
        verify_slice(sliced.path, source_sha256="0" * 64)
    with pytest.raises(ProvenanceMismatch, match="role is middle, not tail"):
        verify_slice(sliced.path, role="tail")
    # The same slice cut from another model (another seed) has another source hash.
    _, other, _ = cut("4L-tied-q4_1", LayerRange(1, 3))
    with pytest.raises(ProvenanceMismatch, match="cut from source"):
        verify_slice(other.path, source_sha256=provenance.source_sha256)


def test_a_source_model_is_not_a_slice(tiny_model: Path) -> None:
    with pytest.raises(ProvenanceMismatch, match="not a meshnet slice"):
        verify_slice(tiny_model)
