"""`meshnet worker --layers auto`: real workers ask a real tracker (SuggestLayers) which range the
swarm needs most within their budget, and the ranges they get chain into a route that serves the
whole model's output."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from swarm_harness import (
    CONTEXT,
    MODEL_NAME,
    PROMPT,
    START_TIMEOUT_S,
    Reference,
    Swarm,
    chat_body,
    start_component,
    write_tiny_model,
)

from meshnet.core.layers import LayerRange
from meshnet.deploy.launch.commands import worker_command
from meshnet.deploy.launch.ready_lines import RegisteredLine
from meshnet.node.auto_layers import layer_costs
from meshnet.node.config import LayerChoice, WorkerConfig

SESSIONS = 8


def _auto_worker(swarm: Swarm, data_dir: Path, budget_mb: float) -> WorkerConfig:
    return WorkerConfig(
        model=swarm.model,
        model_name=MODEL_NAME,
        layer_choice=LayerChoice(None),  # auto
        memory_budget_mb=budget_mb,
        tracker=swarm.tracker_address,
        port=0,
        threads=1,
        n_ctx_per_session=CONTEXT,
        max_sessions=SESSIONS,
        drain_grace=1.0,
        data_dir=data_dir,
    )


def _start_auto_worker(swarm: Swarm, name: str, budget_mb: float) -> LayerRange:
    data_dir = swarm.root / name
    data_dir.mkdir(parents=True, exist_ok=True)
    command = worker_command(_auto_worker(swarm, data_dir, budget_mb), swarm.identity(name, "worker"))
    component = start_component(name, command, swarm.root / f"{name}.log", RegisteredLine)
    swarm.gateways.append(component)  # stopped with the swarm
    return RegisteredLine.read(component.await_ready(time.monotonic() + START_TIMEOUT_S)).layers


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[Swarm]:
    with Swarm(tmp_path, write_tiny_model(tmp_path)) as running:
        running.start_tracker()
        yield running


def test_auto_workers_cover_the_model_in_turn_then_replicate(swarm: Swarm, tmp_path: Path) -> None:
    costs = layer_costs(swarm.model, SESSIONS, CONTEXT)
    # A budget that holds two of the six layers (with the tail's extra) but never three.
    two = max(costs.range_bytes(LayerRange(a, a + 2)) for a in (0, 2, 4))
    assert costs.range_bytes(LayerRange(0, 3)) > two
    budget_mb = two / 2**20 + 0.001
    chosen = [_start_auto_worker(swarm, f"auto-{i}", budget_mb) for i in range(3)]
    assert chosen == [LayerRange(0, 2), LayerRange(2, 4), LayerRange(4, 6)]
    # Every layer is covered once: a roomy joiner replicates the longest chain of the weakest.
    assert _start_auto_worker(swarm, "auto-roomy", budget_mb + 64) == LayerRange(0, 6)

    reference = Reference(swarm.model, tmp_path / "ref")
    expected = reference.text(reference.generate(reference.chat_tokens(PROMPT), 16))
    swarm.wait_routable(4)
    base = swarm.start_gateway()
    reply = httpx.post(f"{base}/v1/chat/completions", json=chat_body(16, stream=False), timeout=60, headers=swarm.auth)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == expected


def test_a_budget_that_holds_no_layer_stops_the_worker_with_a_clear_error(swarm: Swarm) -> None:
    config = WorkerConfig(
        model=swarm.model,
        layer_choice=LayerChoice(None),  # auto
        memory_budget_mb=50,
        tracker=swarm.tracker_address,
        port=0,
        threads=1,
        data_dir=swarm.root / "poor",
    )
    command = worker_command(config, swarm.identity("poor", "worker"))
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "not one layer of this model fits 50 MiB" in done.stderr
    assert "Traceback" not in done.stderr
