"""The synthetic model grid of the family suite: every certified family x weight type, with the
cut patterns each is split at, and a holder that keeps only one model's routes open at a time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Quant

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import FAMILIES, SyntheticSpec
from meshnet.core.layers import LayerRange
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard

QUANTS = ("f32", "q8_0", "q4_0", "q4_k")

_BASE: dict[str, SyntheticSpec] = {
    "llama": SyntheticSpec(),
    # Untied heads and per-layer hyper-parameter arrays (which a slice must cut) on two families.
    "qwen2": SyntheticSpec(architecture="qwen2", per_layer_arrays=True, tied_embeddings=False),
    "qwen3": SyntheticSpec(architecture="qwen3", head_dim=32),
    "qwen3moe": SyntheticSpec(architecture="qwen3moe", per_layer_arrays=True, tied_embeddings=False),
    # 7 layers, default period 6: layers 0-4 and 6 windowed, 5 global; a window of 8 positions
    # is far shorter than the prompts, so windowing changes the numbers.
    "gemma3": SyntheticSpec(architecture="gemma3", n_layers=7, head_dim=32, sliding_window=8),
}

CUTS: dict[str, dict[str, tuple[tuple[int, int], ...]]] = {
    family: {"halves": ((0, 2), (2, 4)), "1-2-1": ((0, 1), (1, 3), (3, 4)), "3-1": ((0, 3), (3, 4))}
    for family in FAMILIES
}
CUTS["gemma3"] = {
    "on the period": ((0, 6), (6, 7)),
    "off the period": ((0, 3), (3, 7)),
    "global layer alone": ((0, 5), (5, 6), (6, 7)),
    "1-3-3 off the period": ((0, 1), (1, 4), (4, 7)),
}


def spec_for(family: str, quant: str) -> SyntheticSpec:
    """The tiny model of ``family`` in ``quant`` (n_embd 64; 256 for the K-quant, its block size)."""
    base = _BASE[family]
    if quant == "q4_k":
        # Q4_K weights and a Q6_K token table (the head dequantizes it in NumPy), as in Q4_K_M files.
        head_dim = None if base.head_dim is None else 64
        return replace(
            base,
            n_embd=256,
            n_ff=256,
            n_ff_expert=256,
            head_dim=head_dim,
            weight_type=Quant.Q4_K,
            embedding_type=Quant.Q6_K,
        )
    qtype = {"f32": Quant.F32, "q8_0": Quant.Q8_0, "q4_0": Quant.Q4_0}[quant]
    return replace(base, weight_type=qtype, embedding_type=qtype)


def grid() -> list[tuple[str, str, str]]:
    return [(f, q, c) for f in FAMILIES for q in QUANTS for c in CUTS[f]]


def bos_of(family: str) -> int:
    return 2 if family == "gemma3" else 1


def prompt_for(family: str, n_vocab: int, length: int, seed: int) -> np.ndarray:
    """BOS then seeded ordinary token ids (above every special token): int32 [length]."""
    rng = np.random.default_rng(seed)
    return np.concatenate([[bos_of(family)], rng.integers(6, n_vocab, length - 1)]).astype(np.int32)


@dataclass
class OpenModel:
    key: tuple[str, str]
    whole: LocalRoute
    splits: dict[str, LocalRoute]

    def close(self) -> None:
        for route in (self.whole, *self.splits.values()):
            route.close()


class FamilyRoutes:
    """Routes of one (family, quant) model at a time: the grid's llama contexts never pile up."""

    def __init__(self, make_model: Callable[[SyntheticSpec], Path], folder: Path, config: LlamaConfig) -> None:
        self._make_model = make_model
        self._folder = folder
        self._config = config
        self._open: OpenModel | None = None

    def get(self, family: str, quant: str) -> OpenModel:
        key = (family, quant)
        if self._open is not None and self._open.key == key:
            return self._open
        self.close()
        spec = spec_for(family, quant)
        source = self._make_model(spec)
        cache = SliceCache(self._folder / f"{family}-{quant}")
        whole = self._route(source, cache, [(0, spec.n_layers)])
        splits = {name: self._route(source, cache, cut) for name, cut in CUTS[family].items()}
        self._open = OpenModel(key, whole, splits)
        return self._open

    def _route(self, source: Path, cache: SliceCache, cut: Sequence[tuple[int, int]]) -> LocalRoute:
        return LocalRoute(
            [open_llama_shard(describe_model(source), LayerRange(a, b), cache, self._config) for a, b in cut]
        )

    def release(self, slots: int) -> None:
        if self._open is not None:
            for route in (self._open.whole, *self._open.splits.values()):
                for slot in range(slots):
                    route.release(slot)

    def close(self) -> None:
        if self._open is not None:
            self._open.close()
            self._open = None


def n_vocab_of(route: LocalRoute) -> int:
    return route.backends[-1].shape.n_vocab
