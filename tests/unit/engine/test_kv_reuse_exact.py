"""A shard's KV exported at a prefill-chunk boundary and imported into another slot continues
exactly as the whole model run cold (issue 31: prefix reuse and session snapshots).

Every certified family, Q4_0 and Q4_K (whose tiled matmul rounds by row count), split head /
middle / tail as certification splits it (gemma3: off its window period, the global layer in
the middle, a window of 8 positions crossed long before the boundary). The oracle is always the
whole model's cold run of the whole prompt. Blobs that are not the shard's own KV at that length
are refused with SnapshotRefused, leave the slot empty, and disturb no other session.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from family_models import prompt_for, spec_for

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.certification_models import certification_cut
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import FAMILIES, SyntheticSpec
from meshnet.core.errors import SnapshotRefused
from meshnet.core.layers import LayerRange
from meshnet.engine.bitwise import bit_identical
from meshnet.engine.fake_backend import FakeBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard

CHUNK = 16
CONFIG = LlamaConfig(n_threads=1, max_slots=3, n_ctx_per_slot=128, max_batch_tokens=CHUNK)
BOUNDARY, LENGTH = 3 * CHUNK, 72  # restored at an aligned chunk boundary, continued past one more
DECODE = 4


def _routes(make: Callable[[SyntheticSpec], Path], folder: Path, spec: SyntheticSpec) -> tuple[LocalRoute, LocalRoute]:
    source = describe_model(make(spec))
    cache = SliceCache(folder)
    whole = LocalRoute([open_llama_shard(source, LayerRange(0, spec.n_layers), cache, CONFIG)])
    split = LocalRoute([open_llama_shard(source, r, cache, CONFIG) for r in certification_cut(spec)])
    return whole, split


def _restore(route: LocalRoute, tokens: np.ndarray, source: int, target: int) -> None:
    """Prefill exactly ``[0, BOUNDARY)`` on ``source``, move every shard's KV to ``target``."""
    route.forward(source, 0, tokens[:BOUNDARY])
    blobs = [backend.export_slot(source) for backend in route.backends]
    route.release(source)
    for backend, blob in zip(route.backends, blobs, strict=True):
        backend.import_slot(target, blob, BOUNDARY)
        assert backend.slot_length(target) == BOUNDARY


@pytest.mark.parametrize("quant", ["q4_0", "q4_k"])
@pytest.mark.parametrize("family", FAMILIES)
def test_restored_prefix_continues_like_the_cold_whole_model(
    family: str, quant: str, synthetic_model_factory: Callable[[SyntheticSpec], Path], tmp_path: Path
) -> None:
    whole, split = _routes(synthetic_model_factory, tmp_path, spec_for(family, quant))
    try:
        tokens = prompt_for(family, whole.backends[-1].shape.n_vocab, LENGTH, 5)
        cold = whole.forward(0, 0, tokens, "all")
        _restore(split, tokens, source=0, target=2)
        assert bit_identical(split.forward(2, BOUNDARY, tokens[BOUNDARY:], "all"), cold[BOUNDARY:])
        expected, actual = cold[-1], cold[-1]
        for step in range(DECODE):  # greedy decode after the restore: the restored cells are attended again
            token = np.array([int(np.argmax(expected))], np.int32)
            expected = whole.forward(0, LENGTH + step, token)[-1]
            actual = split.forward(2, LENGTH + step, token)[-1]
            assert bit_identical(actual, expected), f"decode step {step}"
        assert not np.array_equal(cold[-1], expected)  # the state really moved
    finally:
        whole.close()
        split.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_session_snapshot_resumes_on_other_shards_like_the_uninterrupted_session(
    family: str, synthetic_model_factory: Callable[[SyntheticSpec], Path], tmp_path: Path
) -> None:
    """Failover: a session's KV after prefill and decode steps (decode rows included), exported
    from one route's shards and imported by another route's own contexts, continues exactly as
    the session would have where it was."""
    spec = spec_for(family, "q4_k")
    _, first = _routes(synthetic_model_factory, tmp_path / "first", spec)
    _, second = _routes(synthetic_model_factory, tmp_path / "second", spec)
    try:
        tokens = prompt_for(family, first.backends[-1].shape.n_vocab, 40, 9)
        logits = first.forward(0, 0, tokens)[-1]
        for step in range(3):
            logits = first.forward(0, len(tokens) + step, np.array([int(np.argmax(logits))], np.int32))[-1]
        held = len(tokens) + 3
        for source, target in zip(first.backends, second.backends, strict=True):
            target.import_slot(1, source.export_slot(0), held)
        expected, actual = logits, logits
        for step in range(DECODE):
            token = np.array([int(np.argmax(expected))], np.int32)
            expected = first.forward(0, held + step, token)[-1]
            actual = second.forward(1, held + step, token)[-1]
            assert bit_identical(actual, expected), f"step {step} after the move"
    finally:
        first.close()
        second.close()


# One-row steps over 512 cells or more split the cells among the threads (ggml's split-KV flash
# attention): a restored window cache must sit in the cells the cold run's does, or those steps
# round differently. A long context, two threads, a boundary past 512 positions and a window
# wide enough to span both threads' cells reach it.
LONG = LlamaConfig(n_threads=2, max_slots=2, n_ctx_per_slot=1024, max_batch_tokens=64)


@pytest.mark.parametrize("flash_attn", [True, False], ids=["flash", "transposed-v"])
def test_a_restored_window_cache_decodes_like_the_cold_run_on_two_threads(
    flash_attn: bool, synthetic_model_factory: Callable[[SyntheticSpec], Path], tmp_path: Path
) -> None:
    config = replace(LONG, flash_attn=flash_attn)
    spec = replace(spec_for("gemma3", "q4_0"), sliding_window=300)
    source = describe_model(synthetic_model_factory(spec))
    whole = LocalRoute([open_llama_shard(source, LayerRange(0, spec.n_layers), SliceCache(tmp_path), config)])
    boundary, length = 9 * 64, 9 * 64 + 40
    tokens = prompt_for("gemma3", whole.backends[-1].shape.n_vocab, length, 8)
    try:
        expected = [whole.forward(0, 0, tokens)[-1]]
        for step in range(DECODE):
            expected.append(whole.forward(0, length + step, np.array([int(np.argmax(expected[-1]))], np.int32))[-1])
        whole.release(0)
        whole.forward(0, 0, tokens[:boundary])
        blob = whole.backends[0].export_slot(0)
        whole.release(0)
        whole.backends[0].import_slot(1, blob, boundary)
        actual = [whole.forward(1, boundary, tokens[boundary:])[-1]]
        for step in range(DECODE):
            actual.append(whole.forward(1, length + step, np.array([int(np.argmax(actual[-1]))], np.int32))[-1])
    finally:
        whole.close()
    for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert bit_identical(got, want), f"row {index}"


def _forged_position(blob: bytes) -> bytes:
    """The first cell's position made -5 (52-byte meshnet header, llama magic, seq, streams, count)."""
    forged = bytearray(blob)
    struct.pack_into("<i", forged, 52 + 16, -5)
    return bytes(forged)


REFUSALS: dict[str, Callable[[list[bytes], bytes], tuple[int, bytes, int]]] = {
    # (shard index, blob, tokens claimed) from the split's blobs and another model's middle blob
    "truncated": lambda blobs, _: (1, blobs[1][: len(blobs[1]) // 2], BOUNDARY),
    "header only": lambda blobs, _: (1, blobs[1][:52], BOUNDARY),
    "empty": lambda blobs, _: (1, b"", BOUNDARY),
    # middle (2,3) and tail (3,4) of the 4-layer llama have as many layers: llama.cpp alone loads it
    "another layer range": lambda blobs, _: (2, blobs[1], BOUNDARY),
    "another model": lambda _, other: (1, other, BOUNDARY),
    "fewer tokens claimed": lambda blobs, _: (1, blobs[1], BOUNDARY - CHUNK),
    "more tokens claimed": lambda blobs, _: (1, blobs[1], BOUNDARY + CHUNK),
    "forged negative position": lambda blobs, _: (1, _forged_position(blobs[1]), BOUNDARY),
}


@pytest.fixture(scope="module")
def llama_routes(
    synthetic_model_factory: Callable[[SyntheticSpec], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalRoute, LocalRoute, bytes]]:
    spec = spec_for("llama", "q4_0")
    whole, split = _routes(synthetic_model_factory, tmp_path_factory.mktemp("reuse"), spec)
    _, other = _routes(synthetic_model_factory, tmp_path_factory.mktemp("other"), replace(spec, seed=spec.seed + 1))
    tokens = prompt_for("llama", whole.backends[-1].shape.n_vocab, LENGTH, 6)
    other.forward(0, 0, tokens[:BOUNDARY])
    other_blob = other.backends[1].export_slot(0)
    other.close()
    yield whole, split, other_blob
    whole.close()
    split.close()


@pytest.mark.parametrize("kind", list(REFUSALS))
def test_a_bad_blob_is_refused_and_harms_no_session(
    kind: str, llama_routes: tuple[LocalRoute, LocalRoute, bytes]
) -> None:
    whole, split, other_blob = llama_routes
    tokens = prompt_for("llama", whole.backends[-1].shape.n_vocab, LENGTH, 6)
    cold = whole.forward(0, 0, tokens, "all")
    split.forward(0, 0, tokens[:BOUNDARY])  # a session the refusal must not disturb
    blobs = [backend.export_slot(0) for backend in split.backends]
    shard, blob, claimed = REFUSALS[kind](blobs, other_blob)
    split.forward(1, 0, tokens[:CHUNK])  # the target slot held KV: a refused import leaves it empty
    with pytest.raises(SnapshotRefused):
        split.backends[shard].import_slot(1, blob, claimed)
    assert split.backends[shard].slot_length(1) == 0
    assert bit_identical(split.forward(0, BOUNDARY, tokens[BOUNDARY:], "all"), cold[BOUNDARY:])
    for route in (whole, split):
        for slot in range(CONFIG.max_slots):
            route.release(slot)


@pytest.mark.parametrize("flash_attn", [True, False], ids=["flash", "transposed-v"])
def test_mutated_blobs_never_crash_and_leave_the_slot_whole_or_empty(
    flash_attn: bool, synthetic_model_factory: Callable[[SyntheticSpec], Path], tmp_path: Path
) -> None:
    """Seeded byte flips, overwritten words and truncations of every shard's blob (gemma3: a
    full and a window cache): each import loads all positions or is refused with the slot left
    empty; none raises anything else (a forged row size once asked for gigabytes of padding)."""
    spec = spec_for("gemma3", "q4_0")
    config = replace(CONFIG, flash_attn=flash_attn)
    source = describe_model(synthetic_model_factory(spec))
    split = LocalRoute([open_llama_shard(source, r, SliceCache(tmp_path), config) for r in certification_cut(spec)])
    rng = np.random.default_rng(31)
    try:
        split.forward(0, 0, prompt_for("gemma3", split.backends[-1].shape.n_vocab, BOUNDARY, 4))
        for backend in split.backends:
            blob = backend.export_slot(0)
            for _ in range(300):
                mutated = bytearray(blob)
                at = int(rng.integers(52, len(blob) - 4))
                kind = rng.integers(3)
                if kind == 0:
                    mutated[min(at, 52 + 16 + 12 * BOUNDARY)] ^= 1 << int(rng.integers(8))
                elif kind == 1:
                    mutated[at : at + 4] = rng.integers(0, 2**32, dtype=np.uint64).tobytes()[:4]
                else:
                    del mutated[at:]
                try:
                    backend.import_slot(1, bytes(mutated), BOUNDARY)
                    assert backend.slot_length(1) == BOUNDARY
                except SnapshotRefused:
                    assert backend.slot_length(1) == 0
    finally:
        split.close()


def test_the_fake_engine_restores_exactly_and_refuses_another_range() -> None:
    def fake(layers: LayerRange) -> FakeBackend:
        return FakeBackend(layers, 4, max_slots=3, n_ctx_per_slot=128)

    whole = LocalRoute([fake(LayerRange(0, 4))])
    split = LocalRoute([fake(LayerRange(0, 2)), fake(LayerRange(2, 3)), fake(LayerRange(3, 4))])
    tokens = np.arange(1, LENGTH + 1, dtype=np.int32) % 60
    cold = whole.forward(0, 0, tokens, "all")
    _restore(split, tokens, source=0, target=2)
    assert bit_identical(split.forward(2, BOUNDARY, tokens[BOUNDARY:], "all"), cold[BOUNDARY:])
    with pytest.raises(SnapshotRefused):
        split.backends[2].import_slot(1, split.backends[1].export_slot(2), LENGTH)
    assert split.backends[2].slot_length(1) == 0
