"""What a source model is: name, architecture, size, quantization, read from its GGUF header."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf import LlamaFileType

from meshnet.artifact.gguf_file import parse_gguf
from meshnet.artifact.slicing import model_dimensions


@dataclass(frozen=True)
class ModelDescription:
    name: str
    architecture: str
    adapter_version: str
    n_layers: int
    n_embd: int
    context_length: int
    quantization: str
    n_head: int
    n_head_kv: int


def describe_model(path: Path) -> ModelDescription:
    model = parse_gguf(path)
    adapter, n_layers, n_embd = model_dimensions(model)
    file_type = model.get("general.file_type")
    try:
        quantization = (
            LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else "unknown"
        )
    except ValueError:
        quantization = f"file_type_{file_type}"
    name = str(model.get("general.name") or Path(path).stem)
    n_head = model.get(f"{adapter.name}.attention.head_count", 1)
    return ModelDescription(
        name=name,
        architecture=adapter.name,
        adapter_version=adapter.version,
        n_layers=n_layers,
        n_embd=n_embd,
        context_length=int(model.get(f"{adapter.name}.context_length", 2048)),
        quantization=quantization,
        n_head=int(n_head),
        n_head_kv=int(model.get(f"{adapter.name}.attention.head_count_kv", n_head)),
    )
