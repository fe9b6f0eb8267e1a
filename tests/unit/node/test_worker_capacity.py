"""A worker's capacity plan counts with the one memory cost model, budget and all: the range
``--layers auto`` gets holds the sessions the worker asked for, and a budget too small for one
session stops the worker with the figures that did not fit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshnet.artifact.describe import describe_model
from meshnet.artifact.footprint import memory_footprint
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.errors import InvalidArgument, ResourceExhausted
from meshnet.core.kv_type import KvType
from meshnet.core.layer_costs import MIB, kv_bytes_per_layer, sessions_within, worker_bytes
from meshnet.core.layers import LayerRange
from meshnet.node.assembly import plan_worker_capacity
from meshnet.node.auto_layers import model_costs
from meshnet.node.config import LayerChoice, WorkerConfig
from meshnet.tracker.placement import ServedSpan, suggest_layers

SPEC = SyntheticSpec(n_layers=8, n_embd=256, n_ff=512, n_head=8, n_head_kv=2, n_ctx_train=4096)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_model(tmp_path_factory.mktemp("model") / "model.gguf", SPEC)


def _config(model: Path, layers: LayerRange | None, budget_mib: float | None, sessions: int = 8) -> WorkerConfig:
    return WorkerConfig(
        model,
        LayerChoice(layers),
        Path("."),
        tracker="127.0.0.1:1",
        max_sessions=sessions,
        memory_budget_mb=budget_mib,
        n_ctx_per_session=4096,
    )


def test_the_plan_is_the_cost_models_figures(model: Path) -> None:
    config = _config(model, LayerRange(2, 5), None)
    footprint, load = memory_footprint(model), config.memory_load()
    plan = plan_worker_capacity(config, describe_model(model))
    assert plan.max_sessions == 8 and plan.budget_bytes is None
    assert plan.weight_bytes == sum(footprint.block_bytes[2:5])
    assert plan.kv_bytes_per_session == 3 * kv_bytes_per_layer(footprint, 4096)
    total = plan.weight_bytes + plan.other_bytes + 8 * plan.kv_bytes_per_session
    assert total == worker_bytes(footprint, LayerRange(2, 5), load)


def test_a_budget_cuts_the_sessions_to_what_fits(model: Path) -> None:
    footprint, layers = memory_footprint(model), LayerRange(0, 4)
    three = worker_bytes(footprint, layers, dataclasses.replace(_config(model, layers, None).memory_load(), sessions=3))
    plan = plan_worker_capacity(_config(model, layers, three / MIB), describe_model(model))
    assert plan.max_sessions == 3 and plan.budget_bytes == three


def test_a_budget_below_one_session_stops_the_worker(model: Path) -> None:
    with pytest.raises(ResourceExhausted, match=r"memory budget 60 MiB cannot hold layers 0:4: their weights"):
        plan_worker_capacity(_config(model, LayerRange(0, 4), 60), describe_model(model))


@pytest.mark.parametrize("budget_mib", [175, 200, 300])
def test_auto_layers_get_a_range_whose_plan_keeps_every_session(model: Path, budget_mib: int) -> None:
    """What ``resolve_layers`` does, without the tracker's transport: the worker's costs go to
    ``suggest_layers``; the range that comes back is planned with the budget still set."""
    asking = _config(model, None, budget_mib)
    costs = model_costs(model, asking.memory_load())
    served: list[ServedSpan] = []
    while len(served) < 3:
        layers = suggest_layers(costs, int(budget_mib * MIB), served).layers
        plan = plan_worker_capacity(
            dataclasses.replace(asking, layer_choice=LayerChoice(layers)), describe_model(model)
        )
        assert plan.max_sessions == asking.max_sessions, layers
        assert sessions_within(memory_footprint(model), layers, asking.memory_load(), int(budget_mib * MIB)) == 8
        served.append(ServedSpan(layers, 1.0))


@pytest.mark.parametrize("architecture", ["qwen3moe", "gemma3"])
def test_per_layer_counts_are_read_at_their_widest(architecture: str, tmp_path: Path) -> None:
    # qwen3moe and gemma3 may store counts per layer (arrays): the footprint sizes from the
    # widest layer, so a worker of such a model plans its capacity instead of failing to start.
    spec = SyntheticSpec(architecture=architecture, per_layer_arrays=True, tied_embeddings=False, n_ctx_train=4096)
    path = write_synthetic_model(tmp_path / f"{architecture}.gguf", spec)
    footprint = memory_footprint(path)
    assert footprint.n_ff >= spec.n_ff
    config = _config(path, LayerRange(0, describe_model(path).n_layers), None, sessions=2)
    assert plan_worker_capacity(config, describe_model(path)).max_sessions == 2


def test_a_context_past_the_models_trained_length_is_refused(model: Path) -> None:
    config = dataclasses.replace(_config(model, LayerRange(0, 4), None), n_ctx_per_session=4097)
    with pytest.raises(InvalidArgument, match="--context 4097: a session holds 1 to 4096 positions"):
        plan_worker_capacity(config, describe_model(model))


def test_a_quantized_kv_admits_more_sessions_in_the_same_budget(model: Path) -> None:
    """Sessions are admitted by their KV bytes within the budget: the KV type counts."""
    layers = LayerRange(0, 4)
    f16 = _config(model, layers, None, sessions=32)
    budget = worker_bytes(memory_footprint(model), layers, dataclasses.replace(f16.memory_load(), sessions=4))
    planned = {}
    for kv_type in KvType:
        config = dataclasses.replace(f16, memory_budget_mb=budget / MIB, kv_type=kv_type)
        plan = plan_worker_capacity(config, describe_model(model))
        assert plan.kv_bytes_per_session == 4 * kv_bytes_per_layer(memory_footprint(model), 4096, kv_type)
        planned[kv_type] = plan.max_sessions
    assert planned[KvType.F16] == 4 < planned[KvType.Q8_0] < planned[KvType.Q4_0]
