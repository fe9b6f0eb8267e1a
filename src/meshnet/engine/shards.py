"""Open llama.cpp shards of a source model: cut (or reuse) the slice, then load it."""

from __future__ import annotations

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import ModelDescription
from meshnet.artifact.embedding import EmbeddingTable
from meshnet.core.layers import LayerRange, split_evenly
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute


def open_llama_shard(
    source: ModelDescription, layers: LayerRange, cache: SliceCache, config: LlamaConfig
) -> LlamaBackend:
    layers.check_within(source.n_layers)
    files = cache.shard_files(source.path, layers, source.n_layers)
    embeddings = EmbeddingTable(files.embeddings, source_sha256=files.source_sha256) if files.embeddings else None
    return LlamaBackend(files.slice, config, embeddings=embeddings)


def open_local_route(
    source: ModelDescription,
    n_shards: int,
    cache: SliceCache,
    config: LlamaConfig,
    ranges: list[LayerRange] | None = None,
) -> LocalRoute:
    ranges = ranges or split_evenly(source.n_layers, n_shards)
    return LocalRoute([open_llama_shard(source, r, cache, config) for r in ranges])
