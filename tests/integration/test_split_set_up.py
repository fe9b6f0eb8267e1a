"""`meshnet up --model DIR` where DIR holds a gguf-split set: tracker, three workers and the
gateway start from the set, and a greedy completion equals the unsplit file's whole model."""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest
from swarm_harness import PROMPT, Reference, meshnet_command, write_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "artifact"))
from artifact_split import write_split_set

from meshnet.deploy.launch.ready_lines import UpLine
from meshnet.process.launcher import ChildProcess, LaunchSpec

pytestmark = pytest.mark.timeout(180)
TOKENS = 24


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_up_serves_a_split_set_as_the_unsplit_whole_model(tmp_path: Path) -> None:
    unsplit = write_tiny_model(tmp_path)
    parts = write_split_set(unsplit, tmp_path / "set", max_tensors=16)
    port = _free_port()
    command = meshnet_command(
        tmp_path, "up", "--model", str(parts[0].parent), "--shards", "3", "--port", str(port), "--max-tokens", "2"
    )
    child = ChildProcess(LaunchSpec("up", tuple(command), tmp_path / "up.log", UpLine.PREFIX))
    reference = Reference(unsplit, tmp_path / "reference-cache")
    try:
        child.await_ready(time.monotonic() + 90.0)
        base = f"http://127.0.0.1:{port}/v1"
        auth = {"Authorization": f"Bearer {(tmp_path / 'api-key').read_text().strip()}"}
        model = httpx.get(f"{base}/models", headers=auth, timeout=10).json()["data"][0]["id"]
        body = {"model": model, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0}
        reply = httpx.post(f"{base}/completions", json=body, headers=auth, timeout=60).json()
        expected = reference.text(reference.generate(reference.text_tokens(PROMPT), TOKENS))
        assert reply["choices"][0]["text"] == expected
        assert reply["usage"]["completion_tokens"] == TOKENS
    finally:
        child.stop()
        reference.route.close()
