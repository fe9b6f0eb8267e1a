"""``meshnet worker --expert-group``: an expert-parallel group fronted as one full-range shard.

Two ``meshnet worker --experts I/2`` processes (2 sessions of 512 positions each) and a front
with the worker defaults (8 sessions of 2,048): the front's capability is the group's real one
(2 sessions, 512 positions, layers 0:n, certified), its recipe fingerprint is the one a layer
worker of the same model and settings computes (a group's output is whole-model llama.cpp bit
for bit, so both may serve one route pool). A front given another model file than its group's,
or numerics settings other than its nodes' (``--no-flash-attn``), refuses to start with a
structured error. A front starts its group without sessions: what an
earlier driver left in the nodes' KV (it died holding a session) is released first.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Quant

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.layers import LayerRange
from meshnet.deploy.expert_launch import expert_group_specs, expert_node
from meshnet.deploy.launch.commands import INSECURE, worker_command
from meshnet.deploy.launch.ready_lines import WorkerLine
from meshnet.engine.backend import StepInput
from meshnet.engine.bitwise import bit_identical
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.moe.group_client import ExpertGroupClient
from meshnet.node.assembly import model_identity
from meshnet.node.config import LayerChoice, WorkerConfig
from meshnet.process.launcher import ChildProcess, LaunchSpec, launch_all, stop_all
from meshnet.route.shard_admin import fetch_capability
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.frames import CapabilityInfo

pytestmark = pytest.mark.timeout(240)

SPEC = SyntheticSpec(
    architecture="qwen3moe", n_layers=2, n_expert=64, n_expert_used=8, n_ff_expert=32, weight_type=Quant.Q4_0
)
OTHER = SyntheticSpec(
    architecture="qwen3moe", n_layers=2, n_expert=16, n_expert_used=4, n_ff_expert=32, weight_type=Quant.Q8_0
)


def _front(data: Path, model: Path, peers: list[str], **settings: Any) -> tuple[str, ...]:
    whole = LayerChoice(LayerRange(0, SPEC.n_layers))
    front = WorkerConfig(model=model, layer_choice=whole, data_dir=data, port=0, expert_group=tuple(peers))
    return worker_command(replace(front, **settings), INSECURE)


async def _capability(address: str) -> CapabilityInfo:
    pool = ChannelPool(4 * 2**20, None)
    try:
        return await fetch_capability(pool, address, timeout_s=10.0)
    finally:
        await pool.close()


def test_front_serves_the_groups_capacity_under_the_layer_recipe_and_refuses_other_models_or_recipes(
    tmp_path: Path,
) -> None:
    model = write_synthetic_model(tmp_path / "moe.gguf", SPEC)
    other = write_synthetic_model(tmp_path / "other.gguf", OTHER)
    data = tmp_path / "data"
    node = replace(expert_node(data, model, 2), threads=1, max_sessions=2, n_ctx_per_session=512)
    peers, specs = expert_group_specs(node, tmp_path)
    nodes = launch_all(specs, timeout_s=180)
    prompt = np.random.default_rng(3).integers(3, 290, 40).astype(np.int32)
    front: ChildProcess | None = None
    try:
        stale = ExpertGroupClient(peers)  # an earlier driver that died holding a session in slot 0
        stale.run([StepInput(0, 0, tokens=prompt[:5])])
        stale.close()
        front = ChildProcess(LaunchSpec("front", _front(data, model, peers), tmp_path / "front.log", WorkerLine.PREFIX))
        record = asyncio.run(_capability(WorkerLine.read(front.await_ready(time.monotonic() + 120)).address)).record
        assert (record.layers, record.n_layers) == (LayerRange(0, SPEC.n_layers), SPEC.n_layers)
        assert (record.capability.max_sessions, record.capability.n_ctx_per_session) == (2, 512)
        assert record.capability.prefill_chunk_tokens == WorkerConfig.prefill_chunk
        # It certified the recipe it fronts on its own build, as a full worker of it would.
        certification = record.certification
        assert certification.whole_sha256 == certification.split_sha256 and certification.checks
        layer_worker = WorkerConfig(model=model, layer_choice=LayerRange(0, SPEC.n_layers), data_dir=data)
        recipe = model_identity(layer_worker, SliceCache(data / "cache"), describe_model(model)).recipe
        assert record.fingerprint == certification.fingerprint == recipe.fingerprint()
        front.stop()
        # The front started the group without sessions: slot 0 takes a new prompt from position 0,
        # and its logits are whole-model llama.cpp's bit for bit.
        _assert_fresh_slot_matches_whole_model(tmp_path, model, peers, prompt)

        refused = subprocess.run(_front(data, other, peers), capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "error [failed_precondition]" in refused.stderr and "not the --model this front hashed" in refused.stderr
        # A front whose numerics differ from its nodes' would register a recipe the group does not compute.
        other_numerics = _front(data, model, peers, flash_attn=False)
        refused = subprocess.run(other_numerics, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "error [failed_precondition]" in refused.stderr
        assert f"computes with --prefill-chunk {WorkerConfig.prefill_chunk} --flash-attn --repack" in refused.stderr
    finally:
        if front is not None:
            front.stop()
        stop_all(nodes)


def _assert_fresh_slot_matches_whole_model(root: Path, model: Path, peers: list[str], prompt: np.ndarray) -> None:
    config = LlamaConfig(n_threads=1, max_slots=2, n_ctx_per_slot=512, max_batch_tokens=WorkerConfig.prefill_chunk)
    whole = LlamaBackend(
        SliceCache(root / "ref").shard_files(model, LayerRange(0, SPEC.n_layers), SPEC.n_layers).slice, config
    )
    group = ExpertGroupClient(peers)
    try:
        batch = [StepInput(0, 0, tokens=prompt, want_logits="all")]
        want, got = whole.run(batch)[0].logits, group.run(batch)[0].logits
        assert want is not None and got is not None
        assert bit_identical(want, got)
    finally:
        group.close()
        whole.close()
