"""What an embedding request asks of the tail: how to pool the final hidden states.

Decoder LLMs (llama, qwen2/3, gemma3: the families meshnet serves) carry no ``pooling_type`` in
their GGUF, and their last token is the one that has attended to the whole input, so they pool
by the last token. That is also the only pooling a split reproduces bit for bit: the last row
of llama.cpp's ``result_norm`` is copied as is, whereas llama.cpp's mean pooling is a matmul
whose SIMD summation order NumPy does not follow (measured: 1.8e-7 apart on a synthetic model),
so ``mean`` is refused rather than served close but not equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from meshnet.core.errors import InvalidArgument
from meshnet.core.events import RouteAccepted

PoolingKind = Literal["last"]
POOLING_KINDS: tuple[PoolingKind, ...] = ("last",)


@dataclass(frozen=True)
class EmbeddingSpec:
    pooling: PoolingKind = "last"
    normalize: bool = True
    """Scale to unit L2 length (in float64, as llama-cpp-python's ``embed(normalize=True)``)."""


@dataclass(frozen=True)
class Embedded:
    """One input's pooled vector and the route that computed it (the request log names it)."""

    vector: tuple[float, ...]
    route: RouteAccepted


def pooling_kind(name: str) -> PoolingKind:
    """The pooling named ``name``, or a typed error saying which ones are served and why."""
    for kind in POOLING_KINDS:
        if name == kind:
            return kind
    raise InvalidArgument(
        f"pooling {name[:20]!r} is not served: only 'last' (the last token's final hidden state), "
        "which equals whole-model llama.cpp bit for bit on any split"
    )
