"""Open llama.cpp shards of a source model: cut (or reuse) the slice, then load it."""

from __future__ import annotations

from pathlib import Path

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.embedding import EmbeddingTable
from meshnet.artifact.gguf_file import parse_gguf
from meshnet.artifact.slicing import model_dimensions
from meshnet.core.layers import LayerRange, split_evenly
from meshnet.engine.llama_backend import LlamaBackend, LlamaConfig
from meshnet.engine.local_route import LocalRoute


def model_layer_count(source: Path) -> int:
    return model_dimensions(parse_gguf(source))[1]


def open_llama_shard(source: Path, layers: LayerRange, cache: SliceCache, config: LlamaConfig) -> LlamaBackend:
    n_layers = model_layer_count(source)
    layers.check_within(n_layers)
    files = cache.shard_files(source, layers, n_layers)
    embeddings = EmbeddingTable(files.embeddings, source_sha256=files.source_sha256) if files.embeddings else None
    return LlamaBackend(files.slice, config, embeddings=embeddings)


def open_local_route(
    source: Path, n_shards: int, cache: SliceCache, config: LlamaConfig, ranges: list[LayerRange] | None = None
) -> LocalRoute:
    ranges = ranges or split_evenly(model_layer_count(source), n_shards)
    return LocalRoute([open_llama_shard(source, r, cache, config) for r in ranges])
