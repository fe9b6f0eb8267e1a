"""Architecture adapters: an explicit registry, one module per family.

An adapter states which tensors belong to a layer, to the head (token embedding) and to the tail
(final norm, LM head or tied embedding), and how metadata changes when layers are renumbered.
An architecture without an adapter fails closed: slicing a model we do not understand could
produce a file that loads and silently computes something else.
"""

from __future__ import annotations

from meshnet.artifact.architectures.base import ArchitectureAdapter
from meshnet.artifact.architectures.llama import LLAMA
from meshnet.core.errors import UnsupportedArchitecture

_REGISTRY: dict[str, ArchitectureAdapter] = {adapter.name: adapter for adapter in (LLAMA,)}


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


__all__ = ["ArchitectureAdapter", "adapter_for", "known_architectures"]
