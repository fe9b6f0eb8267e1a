"""The head's quantized embedding table and the content-addressed slice cache."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from artifact_slice_samples import SPECS, flip_byte, tensor_bytes
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from meshnet.artifact import cache as cache_module
from meshnet.artifact.cache import SliceCache
from meshnet.artifact.embedding import EmbeddingTable
from meshnet.artifact.gguf_file import GGUFFile, parse_gguf
from meshnet.artifact.gguf_split import model_sha256
from meshnet.artifact.hashing import file_sha256
from meshnet.artifact.slicing import verify_slice, write_embedding_table, write_slice
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.errors import InvalidArgument, ProvenanceMismatch
from meshnet.core.layers import LayerRange

# -- embedding table --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SPECS))
def test_embedding_table_rows_equal_the_dequantized_source(
    synthetic_model_factory: Callable[[SyntheticSpec], Path], tmp_path: Path, name: str
) -> None:
    source_path = synthetic_model_factory(SPECS[name])
    out = tmp_path / "emb.gguf"
    provenance = write_embedding_table(source_path, out)
    assert provenance.role == "embedding"
    source = parse_gguf(source_path)
    table_file = parse_gguf(out)
    assert list(table_file.tensors) == ["token_embd.weight"]
    assert tensor_bytes(table_file, "token_embd.weight") == tensor_bytes(source, "token_embd.weight")
    info = source.tensors["token_embd.weight"]
    n_embd, n_vocab = info.shape
    raw = np.frombuffer(tensor_bytes(source, "token_embd.weight"), np.uint8).reshape(n_vocab, -1)
    reference = dequantize(raw, GGMLQuantizationType(info.ggml_type)).astype(np.float32)  # [n_vocab, n_embd]
    table = EmbeddingTable(out, source_sha256=file_sha256(source_path))
    try:
        assert (table.n_vocab, table.n_embd) == (n_vocab, n_embd)
        ids = np.array([0, 1, 2, 7, n_vocab - 1, 7, 100], np.int32)
        rows = table.lookup(ids)
        assert rows.dtype == np.float32 and rows.shape == (len(ids), n_embd)
        assert np.array_equal(rows, reference[ids])
        assert not np.array_equal(rows[3], rows[4])  # distinct tokens, distinct rows
        for bad in (
            np.array([n_vocab], np.int32),
            np.array([-1], np.int32),
            np.array([], np.int32),
            np.zeros((1, 1), np.int32),
        ):
            with pytest.raises(InvalidArgument):
                table.lookup(bad)
    finally:
        table.close()


def test_embedding_table_refuses_another_source_or_a_layer_slice(tiny_model: Path, tmp_path: Path) -> None:
    table_path = tmp_path / "emb.gguf"
    write_embedding_table(tiny_model, table_path)
    with pytest.raises(ProvenanceMismatch, match="cut from source"):
        EmbeddingTable(table_path, source_sha256="f" * 64)
    layer_slice = tmp_path / "head.gguf"
    write_slice(tiny_model, LayerRange(0, 2), layer_slice)
    with pytest.raises(ProvenanceMismatch, match="role is head, not embedding"):
        EmbeddingTable(layer_slice)
    table_file = parse_gguf(table_path)
    info = table_file.tensors["token_embd.weight"]
    flip_byte(table_path, table_file.data_offset + info.offset + info.nbytes // 2)
    with pytest.raises(ProvenanceMismatch, match="content hash"):
        EmbeddingTable(table_path)


# -- slice cache ------------------------------------------------------------------------------


@pytest.fixture
def private_source(tiny_model: Path, tmp_path: Path) -> Path:
    return Path(shutil.copyfile(tiny_model, tmp_path / "model.gguf"))


def test_cache_cuts_a_head_with_its_table_and_reuses_both(private_source: Path, tmp_path: Path) -> None:
    cache = SliceCache(tmp_path / "cache")
    files = cache.shard_files(private_source, LayerRange(0, 2), 4)
    assert files.source_sha256 == file_sha256(private_source)
    assert files.embeddings is not None
    verify_slice(files.slice, layers=LayerRange(0, 2), source_sha256=files.source_sha256, role="head")
    verify_slice(files.embeddings, source_sha256=files.source_sha256, role="embedding")
    stamps = {p: p.stat().st_mtime_ns for p in (files.slice, files.embeddings)}
    again = cache.shard_files(private_source, LayerRange(0, 2), 4)
    assert again == files
    assert {p: p.stat().st_mtime_ns for p in (files.slice, files.embeddings)} == stamps


def test_cache_gives_middle_and_tail_no_table(private_source: Path, tmp_path: Path) -> None:
    cache = SliceCache(tmp_path / "cache")
    assert cache.shard_files(private_source, LayerRange(1, 3), 4).embeddings is None
    assert cache.shard_files(private_source, LayerRange(2, 4), 4).embeddings is None
    assert cache.shard_files(private_source, LayerRange(0, 4), 4).embeddings is None


def test_cache_recuts_a_damaged_slice(private_source: Path, tmp_path: Path) -> None:
    cache = SliceCache(tmp_path / "cache")
    files = cache.shard_files(private_source, LayerRange(1, 3), 4)
    original = files.slice.read_bytes()
    sliced = parse_gguf(files.slice)
    flip_byte(files.slice, sliced.data_offset + 5)
    with pytest.raises(ProvenanceMismatch):
        verify_slice(files.slice)
    assert cache.shard_files(private_source, LayerRange(1, 3), 4) == files
    assert files.slice.read_bytes() == original


def test_cache_recuts_a_file_holding_another_range(private_source: Path, tmp_path: Path) -> None:
    cache = SliceCache(tmp_path / "cache")
    files = cache.shard_files(private_source, LayerRange(1, 3), 4)
    write_slice(private_source, LayerRange(2, 4), files.slice)  # a foreign file under this name
    cache.shard_files(private_source, LayerRange(1, 3), 4)
    assert verify_slice(files.slice)[1].layers == LayerRange(1, 3)


def test_cache_hashes_a_source_once_and_again_when_it_changes(
    private_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed: list[Path] = []

    def counting_sha256(model: GGUFFile) -> str:
        hashed.append(model.path)
        return model_sha256(model)

    monkeypatch.setattr(cache_module, "model_sha256", counting_sha256)
    cache = SliceCache(tmp_path / "cache")
    first = cache.source_sha256(private_source)
    assert SliceCache(tmp_path / "cache").source_sha256(private_source) == first  # index survives a new cache object
    assert len(hashed) == 1
    write_synthetic_model(private_source, SyntheticSpec(seed=9))  # same path and size, new bytes
    second = cache.source_sha256(private_source)
    assert second != first and second == file_sha256(private_source)
    assert len(hashed) == 2
    head = cache.shard_files(private_source, LayerRange(0, 1), 4)
    assert head.source_sha256 == second and head.slice.parent.name == second[:16]


def test_cache_survives_a_damaged_hash_index(private_source: Path, tmp_path: Path) -> None:
    cache = SliceCache(tmp_path / "cache")
    digest = cache.source_sha256(private_source)
    (tmp_path / "cache" / "source-hashes.json").write_text("{not json")
    assert cache.source_sha256(private_source) == digest
    assert digest in json.loads((tmp_path / "cache" / "source-hashes.json").read_text()).values()
