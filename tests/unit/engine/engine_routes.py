"""Helpers for engine tests: open whole and split routes of one model, run greedy decodes, and
push batched steps through a route's shards by hand."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.generation import GenerationRequest
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard

N_VOCAB = 293  # the synthetic vocabulary: 3 specials, 256 bytes, 34 pieces


def prompt(length: int, seed: int) -> np.ndarray:
    """BOS followed by ``length - 1`` seeded non-special token ids: int32 [length]."""
    rng = np.random.default_rng(seed)
    return np.concatenate([[1], rng.integers(3, N_VOCAB, length - 1)]).astype(np.int32)


@contextmanager
def open_routes(
    source: Path, cache: SliceCache, config: LlamaConfig, layouts: Mapping[str, Sequence[LayerRange]]
) -> Iterator[dict[str, LocalRoute]]:
    """One independent route (own llama contexts) per named layout; closed on exit."""
    routes: dict[str, LocalRoute] = {}
    description = describe_model(source)
    try:
        for name, ranges in layouts.items():
            routes[name] = LocalRoute([open_llama_shard(description, r, cache, config) for r in ranges])
        yield routes
    finally:
        for route in routes.values():
            route.close()


def release_all(routes: dict[str, LocalRoute], slots: int) -> None:
    for route in routes.values():
        for slot in range(slots):
            route.release(slot)


@dataclass(frozen=True)
class GreedyRun:
    tokens: list[int]
    logits: np.ndarray
    """float32 [steps, n_vocab]: the logits each token was chosen from."""


def greedy(route: LocalRoute, tokens: np.ndarray, steps: int, slot: int = 0) -> GreedyRun:
    """``steps`` greedy tokens after ``tokens`` (no stop token); the slot is freed afterwards."""
    seen: list[np.ndarray] = []
    request = GenerationRequest(tuple(int(t) for t in tokens), steps)
    out = list(route.generate(request, slot=slot, on_logits=lambda row: seen.append(row.copy())))
    return GreedyRun(out, np.stack(seen))


def batched_step(
    route: LocalRoute, steps: Sequence[tuple[int, int, np.ndarray]], want: str = "last"
) -> dict[int, np.ndarray]:
    """Run ``(slot, position, tokens)`` inputs as ONE batch on every shard; logits per slot."""
    backends = route.backends
    inputs = [StepInput(slot, position, tokens=tokens, want_logits=want) for slot, position, tokens in steps]  # type: ignore[arg-type]
    positions = {slot: position for slot, position, _ in steps}
    for backend in backends[:-1]:
        outputs = backend.run(inputs)
        inputs = [StepInput(o.slot, positions[o.slot], hidden=o.hidden, want_logits=want) for o in outputs]  # type: ignore[arg-type]
    return {o.slot: o.logits for o in backends[-1].run(inputs)}  # type: ignore[misc]


def slot_lengths(route: LocalRoute, slot: int) -> list[int]:
    return [backend.slot_length(slot) for backend in route.backends if isinstance(backend, LlamaBackend)]
