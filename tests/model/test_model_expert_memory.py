"""An expert-parallel node keeps only its own routed experts (and its dummies) resident.

A 2-node group of worker processes and a whole-model node (``--experts 0/1``) serve the same
109 MB synthetic qwen3moe (8 layers x 32 experts, top-4); after a prefill and 16 decode steps the
resident pages of each node's model mapping are read from /proc/PID/smaps. Owned experts are 16
of 32 and the dummies 4, so a node may keep at most 20/32 of the routed bytes mapped (plus the
backbone); measured on the dev machine: whole 109.0 MB, EP-2 nodes 40.4-45.7 MB (Q8_0, mmap'd), and
for Q4_0 (repacked copies, the file mapping unused) 57.9 MB whole vs 4.3 MB per node.
Runs with the real-inference tests (MESHNET_ENABLE_REAL_INFERENCE_TESTS=1): it spawns processes.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Quant

from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.deploy.expert_launch import expert_group_specs, expert_node, model_mapping_rss
from meshnet.engine.backend import StepInput
from meshnet.moe.group_client import ExpertGroupClient
from meshnet.moe.shape import read_moe_shape
from meshnet.process.launcher import launch_all, stop_all

pytestmark = pytest.mark.skipif(
    os.environ.get("MESHNET_ENABLE_REAL_INFERENCE_TESTS") != "1",
    reason="set MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 to run process-level measurements",
)
SPEC = SyntheticSpec(
    architecture="qwen3moe",
    n_layers=8,
    n_embd=256,
    n_ff=256,
    n_expert=32,
    n_expert_used=4,
    n_ff_expert=512,
    weight_type=Quant.Q8_0,
)


def _group(tmp_path: Path, model: Path, size: int) -> tuple[list[int], list[int]]:
    node = expert_node(tmp_path / "data", model, size)
    node = replace(node, threads=1, max_sessions=1, n_ctx_per_session=256, prefill_chunk=64)
    peers, specs = expert_group_specs(node, tmp_path)
    children = launch_all(specs, 300)
    try:
        group = ExpertGroupClient(peers)
        group.run([StepInput(0, 0, tokens=np.arange(10, 74, dtype=np.int32))])
        for step in range(16):
            group.run([StepInput(0, 64 + step, tokens=np.array([7 + step], np.int32))])
        released = [node.released_expert_bytes for node in group.describe()]
        group.close()
        return [model_mapping_rss(child.pid) for child in children], released
    finally:
        stop_all(children)


def test_node_keeps_its_own_experts_resident(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path / "moe.gguf", SPEC)
    routed = read_moe_shape(model).routed_bytes
    backbone = model.stat().st_size - routed
    (whole,), (none,) = _group(tmp_path, model, 1)
    assert none == 0 and whole >= 0.95 * model.stat().st_size  # the whole model: every page mapped
    resident, released = _group(tmp_path, model, 2)
    foreign = routed * (32 - 16 - 4) // 32
    mib = 1 << 20
    print(f"whole {whole / 1e6:.1f} MB; EP-2 nodes {[round(r / 1e6, 1) for r in resident]} MB")
    for node_resident, node_released in zip(resident, released, strict=True):
        assert node_released >= 0.95 * foreign  # every foreign expert's whole pages
        assert node_resident <= backbone + routed * 20 // 32 + 4 * mib
