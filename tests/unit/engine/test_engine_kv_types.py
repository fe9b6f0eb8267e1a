"""Quantized KV (``--kv-type q8_0|q4_0``): certified split == whole on this build, greedy output of
a split route equal to the whole model's under each type, and the KV llama.cpp stores per layer
and position equal to what the memory model (``core.layer_costs``) counts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from engine_routes import greedy, open_routes, prompt

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.footprint import memory_footprint
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.errors import InvalidArgument
from meshnet.core.kv_type import KvType
from meshnet.core.layer_costs import kv_bytes_per_layer
from meshnet.core.layers import LayerRange, split_evenly
from meshnet.engine import certification
from meshnet.engine.bitwise import bit_identical, describe_difference
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute

SPEC = SyntheticSpec(n_layers=4, head_dim=32)
"""Heads 32 wide: llama.cpp stores a quantized KV in whole 32-value blocks per head."""
CONFIG = LlamaConfig(n_threads=1, max_slots=2, n_ctx_per_slot=256, max_batch_tokens=32)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_model(tmp_path_factory.mktemp("kv-types") / "llama-4L-hd32.gguf", SPEC)


@pytest.fixture(scope="module", params=[KvType.Q8_0, KvType.Q4_0], ids=str)
def routes(
    request: pytest.FixtureRequest, model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[KvType, dict[str, LocalRoute]]]:
    kv_type = request.param
    layouts = {
        "whole": [LayerRange(0, 4)],
        "3 shards": split_evenly(4, 3),
        "f16 whole": [LayerRange(0, 4)],
    }
    cache = SliceCache(tmp_path_factory.mktemp("kv-cache"))
    config = replace(CONFIG, kv_type=kv_type)
    quantized = {k: v for k, v in layouts.items() if k != "f16 whole"}
    with (
        open_routes(model, cache, config, quantized) as opened,
        open_routes(model, cache, CONFIG, {"f16 whole": layouts["f16 whole"]}) as f16,
    ):
        yield kv_type, {**opened, **f16}


@pytest.mark.parametrize("kv_type", [KvType.Q8_0, KvType.Q4_0], ids=str)
def test_certification_passes_for_each_quantized_kv_type(kv_type: KvType) -> None:
    report = certification.certify_llama_engine(kv_type=kv_type)
    assert report.whole_sha256 == report.split_sha256
    assert all(f"kv {kv_type}" in check for check in report.checks)
    # The KV type reaches llama.cpp: its logits are not the f16 KV's.
    assert report.whole_sha256 != certification.certify_llama_engine().whole_sha256


def test_a_quantized_kv_split_3_ways_equals_the_whole_model(routes: tuple[KvType, dict[str, LocalRoute]]) -> None:
    kv_type, opened = routes
    tokens = prompt(100, 7)  # four prefill chunks of 32
    whole = greedy(opened["whole"], tokens, 16)
    split = greedy(opened["3 shards"], tokens, 16)
    assert split.tokens == whole.tokens
    assert bit_identical(whole.logits, split.logits), describe_difference(whole.logits, split.logits)
    f16 = greedy(opened["f16 whole"], tokens, 16)
    assert not bit_identical(f16.logits, whole.logits), f"{kv_type} KV computed exactly what f16 KV did"


def test_stored_kv_per_layer_and_position_is_what_the_memory_model_counts(
    routes: tuple[KvType, dict[str, LocalRoute]], model: Path
) -> None:
    """The shards of 1 and 2 layers export one session's KV (llama.cpp's per-sequence state): the
    difference is one layer's keys and values at every position, as llama.cpp stores them."""
    kv_type, opened = routes
    shards = opened["3 shards"].backends
    positions = 200
    shards_layers = [len(shard.shape.layers) for shard in shards]
    assert sorted(shards_layers[:2]) == [1, 2]
    opened["3 shards"].forward(1, 0, prompt(positions, 3))
    try:
        sizes = {len(shard.shape.layers): len(shard.export_slot(1)) for shard in shards[:2]}
    finally:
        opened["3 shards"].release(1)
    measured = (sizes[2] - sizes[1]) / positions
    counted = kv_bytes_per_layer(memory_footprint(model), 1, kv_type)
    assert counted == {KvType.Q8_0: 4 * 34, KvType.Q4_0: 4 * 18}[kv_type]  # 128 values a position
    assert abs(measured - counted) <= 0.01 * counted, f"llama.cpp stores {measured:.2f} B, the model counts {counted}"


def test_a_quantized_v_cache_needs_flash_attention() -> None:
    with pytest.raises(InvalidArgument, match="flash attention"):
        LlamaConfig(
            n_threads=1, max_slots=1, n_ctx_per_slot=64, max_batch_tokens=8, flash_attn=False, kv_type=KvType.Q8_0
        )
