"""What a mixture-of-experts GGUF says about its routed experts, for expert parallelism.

The expert counts come from metadata (scalars, or per-layer arrays that must agree: a group
exchanges one fixed number of slots per layer); the byte ranges of each routed expert inside
the stacked ``ffn_{gate,up,down}_exps`` tensors say what a node that owns 1/N of them needs
resident.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meshnet.artifact.gguf_file import GGUFFile, parse_gguf
from meshnet.core.errors import UnsupportedModelVariant

EXPERT_PARALLEL_FAMILIES = ("qwen3moe",)
"""Families whose MoE graph (``build_moe_ffn`` without shared experts) the mechanism is certified on."""
ROUTED_EXPERT_TENSORS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


@dataclass(frozen=True)
class ExpertSpan:
    """One routed expert's bytes inside one stacked expert tensor (absolute file offsets)."""

    tensor: str
    expert: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class MoeShape:
    architecture: str
    n_layers: int
    n_embd: int
    n_expert: int
    n_expert_used: int
    spans: tuple[ExpertSpan, ...]
    """Every routed expert of every layer, in file order."""

    @property
    def routed_bytes(self) -> int:
        return sum(span.nbytes for span in self.spans)


def _uniform(model: GGUFFile, key: str) -> int:
    value = model.require(key)
    if isinstance(value, list):
        if not value or any(v != value[0] for v in value):
            raise UnsupportedModelVariant(
                f"{model.path.name}: {key} differs between layers; expert parallelism needs one value"
            )
        return int(value[0])
    return int(value)


def read_moe_shape(path: Path) -> MoeShape:
    """The routed-expert geometry of the model at ``path``; refuses a family not certified for it."""
    model = parse_gguf(Path(path))
    arch = model.architecture
    if arch not in EXPERT_PARALLEL_FAMILIES:
        raise UnsupportedModelVariant(
            f"{Path(path).name} is {arch}; expert parallelism is certified for {', '.join(EXPERT_PARALLEL_FAMILIES)}"
        )
    n_layers = int(model.require(f"{arch}.block_count"))
    n_expert = _uniform(model, f"{arch}.expert_count")
    spans = []
    for layer in range(n_layers):
        for suffix in ROUTED_EXPERT_TENSORS:
            info = model.tensors.get(f"blk.{layer}.{suffix}")
            if info is None or info.shape[-1] != n_expert:
                raise UnsupportedModelVariant(
                    f"{Path(path).name}: blk.{layer}.{suffix} is not {n_expert} stacked experts"
                )
            per_expert = info.nbytes // n_expert
            start = model.data_offset + info.offset
            spans += [ExpertSpan(info.name, e, start + e * per_expert, per_expert) for e in range(n_expert)]
    return MoeShape(
        arch,
        n_layers,
        int(model.require(f"{arch}.embedding_length")),
        n_expert,
        _uniform(model, f"{arch}.expert_used_count"),
        tuple(spans),
    )
