"""What a model file is, read once from its GGUF header into one typed description.

Shards, the tokenizer, capacity planning, the gateway and the bench all take this value instead
of parsing the header again, so they cannot disagree about a model's shape or name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gguf import LlamaFileType

from meshnet.artifact.gguf_split import open_model
from meshnet.artifact.model_id import served_model_id
from meshnet.artifact.slicing import model_dimensions
from meshnet.core.layers import LayerRange, split_by_work

DEFAULT_CONTEXT_LENGTH = 2048
"""Assumed when a GGUF does not state its training context."""


@dataclass(frozen=True)
class ModelDescription:
    path: Path
    """The GGUF file described."""
    name: str
    """The name it is served under: the file's stem as a model id (``model_id.served_model_id``)."""
    architecture: str
    """Adapter name (``llama``, ...): the certified family the file belongs to."""
    adapter_version: str
    """Version of that adapter, part of the recipe."""
    n_layers: int
    """Transformer blocks in this file (the whole model for a source, its range for a slice)."""
    n_embd: int
    """Width of the hidden state that crosses every seam."""
    context_length: int
    """Positions the model was trained for."""
    quantization: str
    """Weight quantization (``Q4_1``, ...), from ``general.file_type``."""
    n_head: int
    """Attention heads."""
    n_head_kv: int
    """Key/value heads (fewer than ``n_head`` under grouped-query attention)."""
    has_tokenizer: bool
    """Whether the file carries a vocabulary (head and middle slices carry none)."""
    chat_template: str | None
    """The Jinja chat template stored in the file, if any."""


def describe_model(path: Path) -> ModelDescription:
    """Parse the header of ``path`` (no tensor data is read)."""
    model = open_model(path)
    adapter, n_layers, n_embd = model_dimensions(model)
    file_type = model.get("general.file_type")
    try:
        quantization = (
            LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else "unknown"
        )
    except ValueError:
        quantization = f"file_type_{file_type}"
    n_head = widest(model.get(f"{adapter.name}.attention.head_count", 1))
    template = model.get("tokenizer.chat_template")
    return ModelDescription(
        path=model.path,
        name=served_model_id(model.path),
        architecture=adapter.name,
        adapter_version=adapter.version,
        n_layers=n_layers,
        n_embd=n_embd,
        context_length=int(model.get(f"{adapter.name}.context_length", DEFAULT_CONTEXT_LENGTH)),
        quantization=quantization,
        n_head=n_head,
        n_head_kv=widest(model.get(f"{adapter.name}.attention.head_count_kv", n_head)),
        has_tokenizer=model.get("tokenizer.ggml.model") not in (None, "none"),
        chat_template=template if isinstance(template, str) else None,
    )


def widest(value: object) -> int:
    """A count stored as a scalar or per layer (qwen3moe, gemma3 may store arrays): the
    largest, so sizing from it never undercounts a layer."""
    values = value if isinstance(value, list) else [value]
    return max(int(v) for v in values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class DecodeWork:
    """What each part of a model multiplies per token: the weight elements of each block, and of
    the output norm and LM head that only a tail runs (the token table when they are tied).

    Parameters, not bytes: a Q8_0 LM head beside Q4_1 blocks costs what its elements cost (one
    multiply-add each), and its bytes would overstate it by the width of the quantization. An
    MoE block counts all of its experts; every block has as many, so the balance holds.
    """

    layers: tuple[int, ...]
    tail: int

    def split(self, n_shards: int, cores: Sequence[int] | None = None) -> list[LayerRange]:
        """The contiguous ranges whose busiest shard (or, with ``cores`` shared by several
        shards, busiest core) does the least per decoded token."""
        return split_by_work(self.layers, n_shards, tail_work=self.tail, cores=cores)

    def prefill_split(self, n_shards: int) -> list[LayerRange]:
        """The same for a long prompt: its every row runs every block, but the LM head runs for
        its last row only, so the tail's extra work is nothing beside the prompt's."""
        return split_by_work(self.layers, n_shards)


def decode_work(path: Path) -> DecodeWork:
    """Read ``path``'s header for its ``DecodeWork`` (no tensor data is read)."""
    model = open_model(path)
    _, n_layers, _ = model_dimensions(model)
    layers = [0] * n_layers
    tail = 0
    tied = "output.weight" not in model.tensors
    for tensor in model.tensors.values():
        if tensor.name.startswith("blk."):
            layers[int(tensor.name.split(".")[1])] += tensor.n_elements
        elif tensor.name.startswith("output") or (tied and tensor.name == "token_embd.weight"):
            tail += tensor.n_elements
    return DecodeWork(tuple(layers), tail)
