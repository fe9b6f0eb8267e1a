"""A model's memory footprint from its GGUF header: the inputs of the one memory cost model.

``core.layer_costs`` turns this value into what a worker of any range holds; reading the header
is the only part that needs ``gguf``, so it lives here. Only the header is read: a header-only
copy of the source (what a worker fetching by model id holds) gives the same footprint.
"""

from __future__ import annotations

from pathlib import Path

from meshnet.artifact.architectures.base import ArchitectureAdapter
from meshnet.artifact.certification_models import served_types
from meshnet.artifact.describe import widest
from meshnet.artifact.gguf_file import GGUFFile
from meshnet.artifact.gguf_split import open_model
from meshnet.artifact.slicing import model_dimensions
from meshnet.core.layer_costs import ModelFootprint


def memory_footprint(path: Path) -> ModelFootprint:
    """Read ``path``'s header for its ``ModelFootprint`` (no tensor data is read)."""
    model = open_model(path)
    adapter, n_layers, n_embd = model_dimensions(model)
    blocks = [0] * n_layers
    for tensor in model.tensors.values():
        located = adapter.layer_of(tensor.name)
        if located is not None:
            blocks[located[0]] += tensor.nbytes
    tensors = model.tensors
    table = tensors[adapter.token_embedding].nbytes if adapter.token_embedding in tensors else 0
    tail_names = [name for name in (adapter.output_norm, *adapter.tail_tensors) if name in tensors]
    tied = not any(name in tensors for name in adapter.tail_tensors)
    tail = sum(tensors[name].nbytes for name in tail_names) + (table if tied else 0)
    n_head = widest(model.get(adapter.key("attention.head_count"), 1))
    n_head_kv = widest(model.get(adapter.key("attention.head_count_kv"), n_head))
    key_length = int(model.get(adapter.key("attention.key_length"), n_embd // max(n_head, 1)))
    value_length = int(model.get(adapter.key("attention.value_length"), key_length))
    return ModelFootprint(
        block_bytes=tuple(blocks),
        table_bytes=table,
        tail_weight_bytes=tail,
        tied=tied,
        n_embd=n_embd,
        n_ff=_feed_forward_width(model, adapter),
        n_q=n_head * key_length,
        n_kv=n_head_kv * (key_length + value_length),
        n_vocab=len(model.get("tokenizer.ggml.tokens", ())) or int(model.get(adapter.vocab_size_key(), 0)),
        n_merges=len(model.get("tokenizer.ggml.merges", ())),
        weight_types=max(len(served_types(path)[1]), 1),
    )


def _feed_forward_width(model: GGUFFile, adapter: ArchitectureAdapter) -> int:
    """The dense feed-forward width, or the active experts' together when wider (MoE)."""
    dense = widest(model.get(adapter.key("feed_forward_length"), 0))
    used = widest(model.get(adapter.key("expert_used_count"), 0))
    return max(dense, widest(model.get(adapter.key("expert_feed_forward_length"), 0)) * used)
