"""Expert-parallel groups of 1, 2 and 4 nodes equal whole-model llama.cpp bit for bit.

Two synthetic qwen3moe shapes (qwen3moe has no shared expert): 64 experts with top-8 on the
repacked Q4_0 kernels, and 16 experts with top-4, per-layer metadata arrays and Q4_K blocks.
The reference is a plain ``LlamaBackend`` over the same file and settings (repack, flash
attention). The router's top-k choices are compared separately from the numerics, against an
observer node (``0/1``) that runs beside the reference.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Quant

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.engine.bitwise import bit_identical, describe_difference
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.moe.backend import ExpertParallelBackend, RoutingRecord
from meshnet.moe.group import ExpertGroup
from meshnet.moe.ownership import ExpertOwnership

SHAPES = {
    "64x-top8-q4_0": SyntheticSpec(
        architecture="qwen3moe", n_layers=2, n_expert=64, n_expert_used=8, n_ff_expert=32, weight_type=Quant.Q4_0
    ),
    "16x-top4-q4_k": SyntheticSpec(
        architecture="qwen3moe",
        n_layers=3,
        n_embd=256,
        n_ff=256,
        n_expert=16,
        n_expert_used=4,
        n_ff_expert=256,
        per_layer_arrays=True,
        weight_type=Quant.Q4_K,
        seed=3,
    ),
}
CONFIG = LlamaConfig(n_threads=1, max_slots=4, n_ctx_per_slot=640, max_batch_tokens=128)
PREFILL, DECODE = 512, 64


class Reference:
    """Whole-model llama.cpp, plus an observer node recording the router's top-k."""

    def __init__(self, path: Path) -> None:
        self.whole = LlamaBackend(path, CONFIG)
        self.observer = ExpertParallelBackend(path, CONFIG, ExpertOwnership(0, 1))

    def run(self, batch: list[StepInput]) -> tuple[list[np.ndarray], RoutingRecord]:
        record = RoutingRecord()
        self.observer.record_routing(record)
        observed = self.observer.run(batch)
        whole = self.whole.run(batch)
        for a, b in zip(observed, whole, strict=True):
            _require_bits(a.logits, b.logits, "observer vs whole model")
        return [o.logits for o in whole], record  # type: ignore[misc]

    def release(self) -> None:
        for slot in range(CONFIG.max_slots):
            self.whole.truncate(slot, 0)
            self.observer.truncate(slot, 0)

    def close(self) -> None:
        self.whole.close()
        self.observer.close()


def _require_bits(a: np.ndarray | None, b: np.ndarray | None, what: str) -> None:
    assert a is not None and b is not None, what
    assert bit_identical(a, b), f"{what}: {describe_difference(a, b)}"


def _run_group(group: ExpertGroup, batch: list[StepInput]) -> tuple[list[np.ndarray], list[RoutingRecord]]:
    records = [RoutingRecord() for _ in group.nodes]
    for node, record in zip(group.nodes, records, strict=True):
        node.record_routing(record)
    outputs = group.run(batch)
    return [o.logits for o in outputs], records  # type: ignore[misc]


def _same_routing(reference: RoutingRecord, nodes: list[RoutingRecord]) -> None:
    """Top-k sets (and their order, which fixes the fold) of every node equal the whole model's."""
    for record in nodes:
        assert [layer for layer, _ in record.selected] == [layer for layer, _ in reference.selected]
        for (_, want), (_, got) in zip(reference.selected, record.selected, strict=True):
            assert np.array_equal(np.sort(want, axis=1), np.sort(got, axis=1)), "top-k sets differ"
            assert np.array_equal(want, got), "top-k order differs"


@pytest.fixture(scope="module", params=sorted(SHAPES))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Reference]]:
    folder = tmp_path_factory.mktemp(request.param)
    spec = SHAPES[request.param]
    source = describe_model(write_synthetic_model(folder / "moe.gguf", spec))
    path = SliceCache(folder / "cache").shard_files(source.path, LayerRange(0, spec.n_layers), spec.n_layers).slice
    reference = Reference(path)
    yield path, reference
    reference.close()


@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_prefill_and_greedy_decode_bit_identical(model: tuple[Path, Reference], group_size: int) -> None:
    path, reference = model
    reference.release()
    group = ExpertGroup.open(path, CONFIG, group_size)
    try:
        prompt = np.random.default_rng(group_size).integers(3, 290, PREFILL).astype(np.int32)
        batch = [StepInput(0, 0, tokens=prompt, want_logits="all")]
        want, want_routing = reference.run(batch)
        got, routing = _run_group(group, batch)
        _require_bits(want[0], got[0], f"{group_size} nodes, {PREFILL}-token prefill")
        _same_routing(want_routing, routing)
        token, position = int(np.argmax(want[0][-1])), PREFILL
        for step in range(DECODE):
            batch = [StepInput(0, position, tokens=np.array([token], np.int32))]
            want, want_routing = reference.run(batch)
            got, routing = _run_group(group, batch)
            _require_bits(want[0], got[0], f"{group_size} nodes, decode step {step}")
            _same_routing(want_routing, routing)
            token, position = int(np.argmax(want[0][-1])), position + 1
    finally:
        group.close()


@pytest.mark.parametrize("group_size", [2, 4])
def test_four_concurrent_sessions_bit_identical(model: tuple[Path, Reference], group_size: int) -> None:
    path, reference = model
    reference.release()
    group = ExpertGroup.open(path, CONFIG, group_size)
    rng = np.random.default_rng(7)
    try:
        prompts = [rng.integers(3, 290, n).astype(np.int32) for n in (40, 9, 130, 64)]
        batch = [StepInput(slot, 0, tokens=p) for slot, p in enumerate(prompts)]
        positions = [len(p) for p in prompts]
        for step in range(8):
            want, want_routing = reference.run(batch)
            got, routing = _run_group(group, batch)
            for slot in range(len(prompts)):
                _require_bits(want[slot], got[slot], f"session {slot}, step {step}")
            _same_routing(want_routing, routing)
            batch = [
                StepInput(slot, positions[slot] + step, tokens=np.array([int(np.argmax(want[slot][-1]))], np.int32))
                for slot in range(len(prompts))
            ]
    finally:
        group.close()
