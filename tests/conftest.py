"""Fixtures shared by every test area: tiny synthetic GGUF models and a small engine config.

Everything here is generic and cheap. Heavy objects (llama.cpp contexts, routes) belong to the
test module that needs them, built in a module-scoped fixture so a module loads them once.
``llama_cpp`` is imported lazily, inside fixtures, so control-plane tests never load it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model

# Property tests draw the same examples on every run (and keep no example database): a CI run
# that fails, fails again, and one that passes did not pass by luck.
settings.register_profile("meshnet", derandomize=True, database=None)
settings.load_profile("meshnet")

if TYPE_CHECKING:
    from meshnet.engine.llama_config import LlamaConfig
    from meshnet.route.shard_stream import ChannelPool

SyntheticModelFactory = Callable[[SyntheticSpec], Path]


@pytest.fixture(scope="session")
def synthetic_model_factory(tmp_path_factory: pytest.TempPathFactory) -> SyntheticModelFactory:
    """``make(spec) -> path``: writes the tiny model for ``spec`` once per session.

    Files are shared by every test that asks for the same spec: treat them as read-only (copy a
    file before damaging it). A spec always writes the same bytes, so sharing is safe.
    """
    folder = tmp_path_factory.mktemp("synthetic-models")
    written: dict[SyntheticSpec, Path] = {}

    def make(spec: SyntheticSpec) -> Path:
        if spec not in written:
            name = (
                f"{spec.architecture}-{spec.n_layers}L-{spec.weight_type.name}-{spec.embedding_type.name}"
                f"-{'tied' if spec.tied_embeddings else 'untied'}-s{spec.seed}.gguf"
            )
            written[spec] = write_synthetic_model(folder / name, spec)
        return written[spec]

    return make


@pytest.fixture(scope="session")
def tiny_model(synthetic_model_factory: SyntheticModelFactory) -> Path:
    """The default synthetic model: llama, 4 layers, Q4_1 weights, tied Q8_0 embeddings. Read-only."""
    return synthetic_model_factory(SyntheticSpec())


@pytest.fixture(scope="session")
def small_llama_config() -> LlamaConfig:
    """A llama.cpp config sized for synthetic models: 4 slots of 256 positions, 1 thread.

    ``max_batch_tokens=32`` is deliberately small so a 100-token prompt exercises chunked prefill.
    ``split_small_decode_batches=False``: its few sessions' steps run batched through the tied Q8_0
    LM head, the kernels larger batches are served with, not one row per call.
    """
    from meshnet.engine.llama_config import LlamaConfig

    return LlamaConfig(
        n_threads=1, max_slots=4, n_ctx_per_slot=256, max_batch_tokens=32, split_small_decode_batches=False
    )


@pytest.fixture
async def pool() -> AsyncIterator[ChannelPool]:
    """One gRPC channel pool per test for tests that talk to worker processes; closed after."""
    from meshnet.route.shard_stream import ChannelPool
    from meshnet.wire.frames import DEFAULT_MAX_FRAME_BYTES

    opened = ChannelPool(DEFAULT_MAX_FRAME_BYTES)
    yield opened
    await opened.close()
