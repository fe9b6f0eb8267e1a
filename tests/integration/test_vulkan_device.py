"""GPUs without a GPU: a real Vulkan device (Mesa's lavapipe, on the CPU) serves shards.

``make test`` installs lavapipe and builds llama-cpp-python with ``-DGGML_VULKAN=on`` into
``.venv-vulkan`` (``scripts/build_backend.sh``); these tests run that build's ``meshnet``:
- ``meshnet devices`` lists the Vulkan device, certified;
- a 3-shard all-Vulkan route equals the whole model on Vulkan, token for token;
- a worker with ``--device vulkan`` certifies, measures its drift and serves; beside a CPU
  worker its route is refused by default naming both device classes, and served labelled
  ``mixed`` with its drift when the tracker opts in (``--allow-mixed-routes``).
lavapipe is slow (about 1.6 tok/s on SmolLM2 under load), so the models are tiny synthetic ones
but for one short SmolLM2 check; llama.cpp offers it only when ``GGML_VK_VISIBLE_DEVICES`` names it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from swarm_harness import PROMPT, Swarm, list_models, read_sse, write_tiny_model

from meshnet.artifact.provision import model_path
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.devices import DeviceRequest
from meshnet.core.errors import MeshnetError

VULKAN_VENV = Path(__file__).resolve().parents[2] / ".venv-vulkan"
VULKAN_MESHNET = (str(VULKAN_VENV / "bin" / "python"), "-m", "meshnet")
DATA_DIR = Path(os.environ.get("MESHNET_DATA_DIR", Path(__file__).resolve().parents[2] / ".data"))
SMOLLM2 = model_path(DATA_DIR / "models")
REAL = os.environ.get("MESHNET_ENABLE_REAL_INFERENCE_TESTS") == "1" and SMOLLM2.exists()
START_S = 180.0
"""A Vulkan worker certifies and measures its drift on lavapipe before it listens."""

pytestmark = pytest.mark.skipif(
    not (VULKAN_VENV / ".meshnet-backend").exists(),
    reason="no Vulkan build of llama.cpp: `make vulkan` (root with apt-get) installs lavapipe, builds .venv-vulkan",
)


@pytest.fixture(autouse=True)
def lavapipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp hides CPU-type Vulkan devices (lavapipe) unless named: name it, for every
    process these tests start."""
    monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", "0")


def vulkan_meshnet(data_dir: Path, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    # The Vulkan venv holds this very source (editable), and PYTHONPATH, if set, still names it.
    command = [*VULKAN_MESHNET, "--data-dir", str(data_dir), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=dict(os.environ), check=False)


def test_devices_lists_the_vulkan_device_certified(tmp_path: Path) -> None:
    listed = vulkan_meshnet(tmp_path, "devices")
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines() if line.strip()}
    assert "vulkan" in lines and "cpu" in lines, listed.stdout
    assert "certified" in lines["vulkan"] and "llvmpipe" in lines["vulkan"], lines["vulkan"]
    # The CPU build offers no such device, and says so rather than serving on the CPU.
    refused = subprocess.run(
        [sys.executable, "-m", "meshnet", "--data-dir", str(tmp_path), "certify", "--device", "vulkan"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 2 and "offers no such device" in refused.stderr


def _generate(model: Path, data_dir: Path, shards: int, max_tokens: int) -> str:
    args = ["generate", "--raw", "the a is", "--model", str(model), "--device", "vulkan", "--shards", str(shards)]
    args += ["--max-tokens", str(max_tokens), "--threads", "1", "--max-sessions", "1", "--context", "128"]
    done = vulkan_meshnet(data_dir, *args)
    assert done.returncode == 0, done.stderr
    assert f": {shards} in-process shard(s) on vulkan:0" in done.stderr
    return done.stdout


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_three_shard_vulkan_route_equals_the_whole_model_on_vulkan(family: str, tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path / f"{family}.gguf", SyntheticSpec(architecture=family, n_layers=6))
    whole = _generate(model, tmp_path, 1, 24)
    assert whole.strip()
    assert _generate(model, tmp_path, 3, 24) == whole


@pytest.mark.real_model
@pytest.mark.skipif(not REAL, reason="set MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 with SmolLM2 provisioned")
def test_smollm2_split_on_vulkan_equals_whole_on_vulkan(tmp_path: Path) -> None:
    whole = _generate(SMOLLM2, tmp_path, 1, 6)
    assert _generate(SMOLLM2, tmp_path, 3, 6) == whole


@pytest.fixture()
def mixed_swarm(tmp_path: Path) -> Iterator[Swarm]:
    with Swarm(tmp_path, write_tiny_model(tmp_path)) as swarm:
        yield swarm


def wait_recipes(swarm: Swarm, count: int, timeout_s: float = 30.0) -> None:
    """Until the tracker lists ``count`` recipes of the model (a CPU one and a Vulkan one)."""
    deadline = time.monotonic() + timeout_s
    seen: object = None
    while time.monotonic() < deadline:
        try:
            seen = asyncio.run(list_models(swarm.tracker_address, swarm.security))
        except MeshnetError as error:  # the tracker may be restarting; the deadline bounds this
            seen = error
        else:
            if sum(model.name == swarm.model_name for model in seen) == count:
                return
        time.sleep(0.2)
    raise AssertionError(f"the tracker never listed {count} recipes of {swarm.model_name}: {seen!r}")


def _ask(url: str, swarm: Swarm) -> httpx.Response:
    body = {"model": swarm.model_name, "prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    return httpx.post(f"{url}/v1/completions", json=body, headers=swarm.auth, timeout=120)


def test_a_cpu_and_vulkan_route_is_refused_by_default_and_served_mixed_with_the_opt_in(mixed_swarm: Swarm) -> None:
    swarm = mixed_swarm
    swarm.start_tracker()
    swarm.start_workers("0:3", device=DeviceRequest("cpu"))
    (gpu,) = swarm.start_workers("3:6", program=VULKAN_MESHNET, device=DeviceRequest("vulkan"), timeout_s=START_S)
    wait_recipes(swarm, 2)
    url = swarm.start_gateway()
    refused = _ask(url, swarm)
    assert refused.status_code == 503, refused.text
    message = refused.json()["error"]["message"]
    assert "two device classes" in message
    assert "cpu (recipe rcp-" in message and "vulkan:llvmpipe" in message, message

    # The same nodes under a tracker that opts in: served, and labelled mixed with the drift.
    swarm.restart_tracker(allow_mixed_routes=True)
    wait_recipes(swarm, 2)
    body = {"model": swarm.model_name, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": True}
    result = read_sse(url, "/v1/completions", body, headers=swarm.auth, timeout_s=120)
    assert result.status == 200, result.items
    (accepted,) = result.telemetry("accepted")
    assert accepted["numerics"].startswith("mixed (top-1 agreement"), accepted
    assert [hop["device"] for hop in accepted["hops"]] == ["cpu", "vulkan"]
    assert result.text, "the mixed route served no text"
    assert gpu.alive
