"""Architecture adapters: an explicit registry, one module per family.

An adapter states which tensors belong to a layer, to the head (token embedding) and to the tail
(final norm, LM head or tied embedding), which metadata is per-layer and how a slice rewrites it,
and which variants or cuts it refuses. An architecture without an adapter fails closed: slicing
a model we do not understand could produce a file that loads and silently computes something else.

To add a family: read its ``src/models/<arch>.cpp`` in the pinned llama.cpp for every use of the
layer index, write ``<arch>.py`` here, list it below, add a writer to ``artifact/synthetic.py``
and the family to the split-exactness suite (``tests/unit/engine/test_engine_families.py``).
"""

from __future__ import annotations

from meshnet.artifact.architectures.base import ArchitectureAdapter
from meshnet.artifact.architectures.gemma3 import GEMMA3
from meshnet.artifact.architectures.llama import LLAMA
from meshnet.artifact.architectures.qwen2 import QWEN2
from meshnet.artifact.architectures.qwen3 import QWEN3
from meshnet.artifact.architectures.qwen3moe import QWEN3MOE
from meshnet.core.errors import UnsupportedArchitecture

_REGISTRY: dict[str, ArchitectureAdapter] = {
    adapter.name: adapter for adapter in (LLAMA, QWEN2, QWEN3, QWEN3MOE, GEMMA3)
}


def adapter_for(architecture: str) -> ArchitectureAdapter:
    """The adapter for ``architecture``; raises ``UnsupportedArchitecture`` naming it otherwise."""
    adapter = _REGISTRY.get(architecture)
    if adapter is None:
        known = ", ".join(sorted(_REGISTRY))
        raise UnsupportedArchitecture(
            f"architecture {architecture!r} has no certified meshnet adapter (certified: {known}); "
            "refusing to slice or serve it"
        )
    return adapter


def known_architectures() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


__all__ = ["adapter_for", "known_architectures"]
