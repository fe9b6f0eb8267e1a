"""`meshnet up` as a real process whose whole output a test can read (the launcher's pump keeps
only the lines before the ready line)."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from swarm_harness import meshnet_command

from meshnet.deploy.launch.ready_lines import UpLine

START_TIMEOUT_S = 90.0


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def running_up(root: Path, model: Path, *flags: str) -> Iterator[tuple[str, dict[str, str]]]:
    """`meshnet up` on ``model`` until the block ends (its whole output in ``root/up.log``, which
    the launcher's pump would drop after the ready line); yields its API base and the client's auth."""
    port = _free_port()
    argv = ("up", "--model", str(model), "--shards", "2", "--port", str(port), "--max-tokens", "4", "--prompt", "hi")
    log = root / "up.log"
    with log.open("w") as output:
        child = subprocess.Popen(meshnet_command(root, *argv, *flags), stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while UpLine.PREFIX not in log.read_text():
            assert child.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        auth = {"Authorization": f"Bearer {(root / 'api-key').read_text().strip()}"}
        yield f"http://127.0.0.1:{port}/v1", auth
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)


def chat(base: str, auth: dict[str, str]) -> httpx.Response:
    model = httpx.get(f"{base}/models", headers=auth, timeout=10).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    return httpx.post(f"{base}/chat/completions", json=body, headers=auth, timeout=30)
