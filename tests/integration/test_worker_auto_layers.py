"""`meshnet worker --layers auto`: real workers ask a real tracker (SuggestLayers) which range the
swarm needs most within their budget, and the ranges they get chain into a route that serves the
whole model's output. The README's "Across real machines" scenario runs here as written (three
SmolLM2 workers, its budget, every other flag at its default) when the real model is enabled
(MESHNET_ENABLE_REAL_INFERENCE_TESTS=1): the three ranges must cover all 30 layers."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

from meshnet.artifact.provision import model_path
from meshnet.core.layer_costs import WorkerLoad
from meshnet.core.layers import LayerRange
from meshnet.deploy.launch.commands import worker_command
from meshnet.deploy.launch.ready_lines import RegisteredLine
from meshnet.node.auto_layers import model_costs
from meshnet.node.config import LayerChoice, WorkerConfig

SESSIONS = 8
README = Path(__file__).resolve().parents[2] / "README.md"
README_BUDGET_MB = 340
"""The budget the README's "Across real machines" section gives each of three SmolLM2 workers."""
SMOLLM2 = model_path(Path(os.environ.get("MESHNET_DATA_DIR", Path(__file__).resolve().parents[2] / ".data")) / "models")
REAL = os.environ.get("MESHNET_ENABLE_REAL_INFERENCE_TESTS") == "1" and SMOLLM2.exists()


def _auto_worker(swarm: Swarm, data_dir: Path, budget_mb: float, **fields: Any) -> WorkerConfig:
    """A ``--layers auto`` worker's config: the README's flags, ``fields`` over the defaults."""
    return WorkerConfig(
        model=swarm.model,
        model_name=MODEL_NAME,
        layer_choice=LayerChoice(None),  # auto
        memory_budget_mb=budget_mb,
        tracker=swarm.tracker_address,
        port=0,
        data_dir=data_dir,
        **fields,
    )


def _start_auto_worker(swarm: Swarm, name: str, budget_mb: float, **fields: Any) -> LayerRange:
    """A ``--layers auto`` worker; returns the range it serves once the tracker registered it."""
    data_dir = swarm.root / name
    data_dir.mkdir(parents=True, exist_ok=True)
    command = worker_command(_auto_worker(swarm, data_dir, budget_mb, **fields), swarm.identity(name, "worker"))
    component = start_component(name, command, swarm.root / f"{name}.log", RegisteredLine)
    swarm.gateways.append(component)  # stopped with the swarm
    ready = RegisteredLine.read(component.await_ready(time.monotonic() + START_TIMEOUT_S))
    return ready.layers


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[Swarm]:
    with Swarm(tmp_path, write_tiny_model(tmp_path)) as running:
        running.start_tracker()
        yield running


def test_auto_workers_cover_the_model_in_turn_then_replicate(swarm: Swarm, tmp_path: Path) -> None:
    costs = model_costs(swarm.model, WorkerLoad(SESSIONS, CONTEXT, WorkerConfig.prefill_chunk))
    # A budget that holds two of the six layers (with the tail's extra) but never three.
    two = max(costs.range_bytes(LayerRange(a, a + 2)) for a in (0, 2, 4))
    assert costs.range_bytes(LayerRange(0, 3)) > two
    budget_mb = two / 2**20 + 0.001
    flags: dict[str, Any] = {"threads": 1, "n_ctx_per_session": CONTEXT, "max_sessions": SESSIONS, "drain_grace": 1.0}
    chosen = [_start_auto_worker(swarm, f"auto-{i}", budget_mb, **flags) for i in range(3)]
    assert chosen == [LayerRange(0, 2), LayerRange(2, 4), LayerRange(4, 6)]
    # Every layer is covered once: a roomy joiner replicates the longest chain of the weakest.
    assert _start_auto_worker(swarm, "auto-roomy", budget_mb + 64, **flags) == LayerRange(0, 6)
    # The budget held each range with every session: the plan, by the same costs, cut none
    # (each layer is served twice, 8 sessions each).
    assert swarm.wait_routable(4).head_sessions == 2 * SESSIONS

    reference = Reference(swarm.model, tmp_path / "ref")
    expected = reference.text(reference.generate(reference.chat_tokens(PROMPT), 16))
    base = swarm.start_gateway()
    reply = httpx.post(f"{base}/v1/chat/completions", json=chat_body(16, stream=False), timeout=60, headers=swarm.auth)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == expected


def test_a_budget_that_holds_no_layer_stops_the_worker_with_a_clear_error(swarm: Swarm) -> None:
    config = _auto_worker(swarm, swarm.root / "poor", 50, threads=1)
    command = worker_command(config, swarm.identity("poor", "worker"))
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "not one layer of this model fits 50 MiB" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(not REAL, reason="set MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 with SmolLM2 provisioned")
def test_the_readme_machines_cover_smollm2_with_its_budget(tmp_path: Path) -> None:
    """Three workers started one after the other as the README writes them: ``--layers auto
    --memory-budget-mb`` with the README's figure and every other flag at its default (8
    sessions of 2,048 positions). Together they serve all 30 layers, each keeping 8 sessions."""
    assert f"--layers auto --memory-budget-mb {README_BUDGET_MB} " in README.read_text()
    with Swarm(tmp_path, SMOLLM2) as swarm:
        swarm.start_tracker()
        ranges, machines = [], []
        for name in "BCD":
            ranges.append(_start_auto_worker(swarm, f"machine-{name}", README_BUDGET_MB))
            machines.append(swarm.gateways[-1])
        assert [(r.start, r.stop) for r in ranges] == [
            (0, ranges[0].stop),
            (ranges[0].stop, ranges[1].stop),
            (ranges[1].stop, 30),
        ]
        assert swarm.wait_routable(3).head_sessions == WorkerConfig.max_sessions
        reference = Reference(SMOLLM2, tmp_path / "ref")
        try:
            expected = reference.text(reference.generate(reference.chat_tokens(PROMPT), 8))
        finally:
            reference.close()
        base = swarm.start_gateway()
        reply = httpx.post(
            f"{base}/v1/chat/completions", json=chat_body(8, stream=False), timeout=120, headers=swarm.auth
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == expected
        # The budget is what each process holds: every machine's resident size stays within it,
        # after one chat and after every session prefilled a long prompt at once. Each prompt's
        # KV goes to the prompt-reuse store (what the budget leaves it: ~5-18 MiB here) through
        # MiBs of transient copies, and entries are evicted as fast: unless the worker hands the
        # freed heap back (process/heap.py), glibc keeps it, ~29 MiB over the store's share.
        resident = [_resident_mib(machine.pid) for machine in machines]
        assert max(resident) <= README_BUDGET_MB, resident
        _long_prompts_at_once(base, swarm.auth, WorkerConfig.max_sessions)
        resident = [_resident_mib(machine.pid) for machine in machines]
        assert max(resident) <= README_BUDGET_MB, resident


def _long_prompts_at_once(base: str, auth: dict[str, str], sessions: int) -> None:
    """``sessions`` completions at once, each prompt ~450 tokens and its own (nothing to reuse)."""
    filler = "Each machine holds a contiguous range of layers and its sessions' keys and values. " * 28

    def one(index: int) -> int:
        body = {"model": MODEL_NAME, "prompt": f"Note {index}: {filler}Summarise note {index}.", "max_tokens": 8}
        return httpx.post(f"{base}/v1/completions", json=body, timeout=300, headers=auth).status_code

    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
        assert list(pool.map(one, range(sessions))) == [200] * sessions


def _resident_mib(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024
