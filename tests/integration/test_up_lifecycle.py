"""`meshnet up` as a supervisor, run as a real process on the tiny synthetic model.

- SIGKILL of `up` leaves no process of its swarm behind within seconds, and frees the gateway
  port at once (so the next `make run` starts).
- SIGKILL of the tracker under `up` is a restart, not a teardown: the tracker comes back on
  the same port and database, the restart is counted, and the swarm serves again.
- A completion ended by a stop string is stored by `up`'s tracker as `completed`, with the
  tokens and billing units the client was told (the state that makes it eligible for audit;
  tests/integration/test_audit.py sees such a request audited).
- A busy gateway port fails `up` before any component starts, labelled as such.
- The lifeline itself: a child sees its supervisor's end of the pipe close and exits.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from swarm_harness import PROMPT, meshnet_command, query_db, stop_string_of, write_tiny_model
from up_harness import chat, running_up

from meshnet.deploy.launch.ready_lines import UpLine
from meshnet.process.launcher import ChildProcess, LaunchSpec
from meshnet.process.lifeline import EXIT_GRACE_S, ORPHAN_EXIT_CODE
from meshnet.process.ports import PortInUse, ensure_port_free

pytestmark = pytest.mark.timeout(120)

START_TIMEOUT_S = 60.0
ORPHANS_GONE_WITHIN_S = EXIT_GRACE_S + 3.0
"""A child hard-exits ``EXIT_GRACE_S`` after it sees the lifeline cut; the rest is margin for a
loaded 2-core machine, where a graceful shutdown's threads wait their turn. The bound is what
matters (without the lifeline the children never go), not its size."""


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _up_command(root: Path, port: int) -> list[str]:
    model = write_tiny_model(root)
    return meshnet_command(
        root, "up", "--model", str(model), "--shards", "2", "--port", str(port), "--max-tokens", "4", "--prompt", "hi"
    )


def _status(root: Path) -> dict[str, dict[str, Any]]:
    document = json.loads((root / "logs" / "up-status.json").read_text())
    return {component["name"]: component for component in document["components"]}


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[ChildProcess, int]]:
    port = _free_port()
    child = ChildProcess(LaunchSpec("up", tuple(_up_command(tmp_path, port)), tmp_path / "up.log", UpLine.PREFIX))
    try:
        child.await_ready(time.monotonic() + START_TIMEOUT_S)
        yield child, port
    finally:
        child.stop()


def _complete(port: int, data_dir: Path) -> int:
    """Status of one completion sent with the client key `up` wrote to ``DATA_DIR/api-key``."""
    base = f"http://127.0.0.1:{port}/v1"
    auth = {"Authorization": f"Bearer {(data_dir / 'api-key').read_text().strip()}"}
    with contextlib.suppress(httpx.HTTPError):
        model = httpx.get(f"{base}/models", headers=auth, timeout=10).json()["data"][0]["id"]
        body = {"model": model, "prompt": "ok", "max_tokens": 2, "temperature": 0}
        return httpx.post(f"{base}/completions", json=body, headers=auth, timeout=10).status_code
    return 0


def _scrape(url: str) -> dict[str, float]:
    """Every sample of a /metrics page, by sample name (labels dropped: one replica here)."""
    text = httpx.get(url, timeout=10).text
    return {sample.name: sample.value for family in text_string_to_metric_families(text) for sample in family.samples}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigkill_of_up_leaves_no_process_and_frees_the_port(up: tuple[ChildProcess, int], tmp_path: Path) -> None:
    child, port = up
    pids = [component["pid"] for component in _status(tmp_path).values()]
    assert len(pids) == 4 and all(_alive(pid) for pid in pids)  # tracker, 2 workers, gateway
    child.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    child.wait_exit(5.0)
    while any(_alive(pid) for pid in pids) and time.monotonic() - killed_at < ORPHANS_GONE_WITHIN_S:
        time.sleep(0.05)
    left = [pid for pid in pids if _alive(pid)]
    for pid in left:  # a failing run still leaves nothing behind
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    assert not left, f"still running {time.monotonic() - killed_at:.1f} s after SIGKILL of up: {left}"
    ensure_port_free("127.0.0.1", port, "gateway")


def test_up_restarts_a_killed_tracker_and_serves_again(up: tuple[ChildProcess, int], tmp_path: Path) -> None:
    child, port = up
    before = _status(tmp_path)["tracker"]
    assert before["restarts"] == 0 and _complete(port, tmp_path) == 200
    # `up` turns every component's /metrics on and lists where: the tracker counts the two workers.
    assert _scrape(before["metrics"])["meshnet_tracker_live_nodes"] == 2
    assert all(c["metrics"] for c in _status(tmp_path).values())
    # `up` made the client key (owner-only) and its gateway refuses requests without it.
    assert (tmp_path / "api-key").stat().st_mode & 0o777 == 0o600
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 401
    # The official client, unchanged, with the key read from DATA_DIR/api-key.
    key = (tmp_path / "api-key").read_text().strip()
    with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=30) as client:
        model = next(iter(client.models.list())).id
        answer = client.completions.create(model=model, prompt="ok", max_tokens=2, temperature=0)
        assert answer.usage is not None and answer.usage.completion_tokens == 2
    stranger = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="mn-wrong", max_retries=0)
    with stranger, pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    psutil.Process(before["pid"]).kill()
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        after = _status(tmp_path)["tracker"]
        if after["restarts"] == 1 and after["pid"] != before["pid"] and after["address"]:
            break
        time.sleep(0.1)
    assert after["restarts"] == 1, after
    assert after["address"] == before["address"], "the tracker must come back where the workers look for it"
    assert after["last_exit"] == -signal.SIGKILL
    while _complete(port, tmp_path) != 200:
        assert time.monotonic() < deadline, "the swarm never served again after the tracker restart"
        time.sleep(0.2)
    # The restarted tracker serves /metrics again, where its new ready line says.
    assert _scrape(_status(tmp_path)["tracker"]["metrics"])["meshnet_tracker_live_nodes"] == 2
    assert child.alive
    others = {name: c for name, c in _status(tmp_path).items() if name != "tracker"}
    assert all(c["restarts"] == 0 for c in others.values()), others


def test_a_stop_string_completion_is_stored_completed_with_its_tokens_and_billing(
    up: tuple[ChildProcess, int], tmp_path: Path
) -> None:
    _, port = up
    base = f"http://127.0.0.1:{port}/v1"
    auth = {"Authorization": f"Bearer {(tmp_path / 'api-key').read_text().strip()}"}
    model = httpx.get(f"{base}/models", headers=auth, timeout=10).json()["data"][0]["id"]
    assert model == "tiny"  # the file's stem (served_model_id), not its general.name, for workers and gateway alike
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24, "temperature": 0}
    free = httpx.post(f"{base}/chat/completions", json=body, headers=auth, timeout=30).json()
    text = free["choices"][0]["message"]["content"]
    stop, start = stop_string_of(text)
    reply = httpx.post(f"{base}/chat/completions", json={**body, "stop": stop}, headers=auth, timeout=30)
    stopped = reply.json()
    choice, usage = stopped["choices"][0], stopped["usage"]
    assert (choice["message"]["content"], choice["finish_reason"]) == (
        free["choices"][0]["message"]["content"][:start],
        "stop",
    )
    assert usage["completion_tokens"] < free["usage"]["completion_tokens"]
    query = (
        f"SELECT status, tokens_in, tokens_out, billing_units FROM work_records WHERE request_id = '{stopped['id']}'"
    )
    deadline = time.monotonic() + 30.0
    while not (rows := query_db(tmp_path / "tracker.sqlite3", query)) or rows[0][0] == "unverified":
        assert time.monotonic() < deadline, f"the tracker never stored the outcome: {rows}"
        time.sleep(0.1)
    assert rows[0] == ("completed", usage["prompt_tokens"], usage["completion_tokens"], usage["billing_units"])


def test_a_busy_gateway_port_fails_up_before_anything_starts(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(PortInUse):
            ensure_port_free("127.0.0.1", port, "gateway")
        started = time.monotonic()
        done = subprocess.run(
            _up_command(tmp_path, port), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    assert done.returncode == 2, done.stderr
    assert f"[port_in_use] gateway port 127.0.0.1:{port} is already in use" in done.stderr
    assert "worker_lost" not in done.stderr
    assert time.monotonic() - started < 10.0
    assert not list((tmp_path / "logs").glob("*.log")), "nothing may start before the ports are checked"


WATCHER = (
    "import os, time; from meshnet.process.lifeline import watch_lifeline; watch_lifeline(os.environ); "
    "print('watching', flush=True); time.sleep(60)"
)


def test_a_child_exits_when_its_lifeline_is_cut(tmp_path: Path) -> None:
    child = ChildProcess(LaunchSpec("watcher", (sys.executable, "-c", WATCHER), tmp_path / "w.log", "watching"))
    try:
        child.await_ready(time.monotonic() + 20)
        child._lifeline.cut()
        # No SIGTERM handler here: the watcher's SIGTERM ends it at once; the hard exit is the backstop.
        assert child.wait_exit(ORPHANS_GONE_WITHIN_S) in (-signal.SIGTERM, ORPHAN_EXIT_CODE)
    finally:
        child.stop()


def _request_lines(logs: Path) -> list[str]:
    text = "".join(path.read_text() for path in logs.glob("gateway*.log"))
    return [line for line in text.splitlines() if "meshnet.gateway.requests request req-" in line]


def test_up_prints_the_status_page_and_its_gateway_logs_each_request(tmp_path: Path) -> None:
    """The page's URL (never the key) is printed once up is ready, and the gateway's log file
    under DATA_DIR/logs gets one line per request (up's own probe and demo, then ours)."""
    with running_up(tmp_path, write_tiny_model(tmp_path)) as (base, auth):
        printed = (tmp_path / "up.log").read_text()
        assert f"status    {base.removesuffix('/v1')}/status" in printed
        key = (tmp_path / "api-key").read_text().strip()
        assert key not in printed
        before = _request_lines(tmp_path / "logs")
        assert before, "up's own requests were not logged"
        reply = chat(base, auth)
        assert reply.status_code == 200
        deadline = time.monotonic() + 10.0
        while len(lines := _request_lines(tmp_path / "logs")) == len(before) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(lines) == len(before) + 1, lines
    ours = lines[-1]
    assert f"request {reply.json()['id']} key=key-" in ours and "outcome=completed reason=length" in ours, ours
    assert all(key not in line for line in lines)
