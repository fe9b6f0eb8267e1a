"""Progress on long work, and `meshnet status`, against real worker processes (tiny model).

The gateway is given small frames, so a 230-token prompt travels as many prefill chunks: the
client must see one ``prefill_progress`` per chunk, counting up to the whole prompt. Killing the
middle worker mid-answer makes the gateway replay the answer so far onto the spare; that replay
reports progress too (``replay: true``). ``meshnet status`` shows the same swarm as a table,
from the gateway and from the tracker, and exits 1 once a layer range has no node.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from swarm_harness import CONTEXT, LONG_PROMPT, MODEL_NAME, Swarm, chat_body, read_sse, write_tiny_model
from test_swarm_failover import MiddleKiller

from meshnet.process.launcher import meshnet_command
from meshnet.wire.frames import FRAME_OVERHEAD_BYTES

pytestmark = pytest.mark.timeout(120)

ROWS_PER_FRAME = 32
N_EMBD = 64
"""The tiny model's width: a hidden row is 4 * 64 bytes, so the frame below holds 32 rows."""


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    model = write_tiny_model(tmp_path_factory.mktemp("model"))
    with Swarm(tmp_path_factory.mktemp("swarm"), model) as running:
        running.start_tracker()
        running.start_workers("0:2", "2:4", "2:4", "4:6")
        frame = FRAME_OVERHEAD_BYTES + ROWS_PER_FRAME * 4 * N_EMBD
        running.start_gateway(max_frame_bytes=frame)
        running.wait_routable(4)
        yield running


def _base_url(swarm: Swarm) -> str:
    return swarm.gateways[0].ready_line.split()[3]


def _status(swarm: Swarm, *flags: str) -> subprocess.CompletedProcess[str]:
    command = meshnet_command(swarm.root, "status", *flags)
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


def test_models_report_the_context_of_the_route(swarm: Swarm) -> None:
    (model,) = httpx.get(_base_url(swarm) + "/v1/models", headers=swarm.auth, timeout=10).json()["data"]
    assert (model["context_length"], model["routable"]) == (CONTEXT, True)  # the model itself has more
    one = httpx.get(_base_url(swarm) + f"/v1/models/{MODEL_NAME}", headers=swarm.auth, timeout=10).json()
    assert one == model


def test_a_long_prompt_reports_progress_once_per_prefill_chunk(swarm: Swarm) -> None:
    result = read_sse(_base_url(swarm), "/v1/chat/completions", chat_body(8, content=LONG_PROMPT), headers=swarm.auth)
    assert result.status == 200
    total = result.telemetry("prefill_started")[0]["prompt_tokens"]
    progress = result.telemetry("prefill_progress")
    chunks = math.ceil(total / ROWS_PER_FRAME)
    assert chunks >= 7
    assert len(progress) == chunks, progress
    done = [event["done_tokens"] for event in progress]
    assert done == [min(total, ROWS_PER_FRAME * (i + 1)) for i in range(chunks)]
    assert {event["total_tokens"] for event in progress} == {total}
    assert not any(event["replay"] for event in progress)
    assert progress[-1]["eta_seconds"] == 0.0
    assert all(event["eta_seconds"] >= 0 for event in progress)
    kinds = [event["kind"] for event in result.telemetry()]
    assert kinds.index("prefill_started") < kinds.index("prefill_progress") < kinds.index("prefill_completed")


def test_a_failover_replay_reports_progress(swarm: Swarm) -> None:
    killer = MiddleKiller(swarm, after=40)
    result = read_sse(_base_url(swarm), "/v1/chat/completions", chat_body(120), on_item=killer, headers=swarm.auth)
    assert result.status == 200 and result.telemetry("route_health")
    replayed = [event for event in result.telemetry("prefill_progress") if event["replay"]]
    assert replayed, result.telemetry()
    # The replay re-feeds at least the 40 tokens streamed before the kill, after the prompt.
    prompt = result.telemetry("prefill_started")[0]["prompt_tokens"]
    assert replayed[-1]["done_tokens"] == replayed[-1]["total_tokens"] >= prompt + 40
    assert result.telemetry()[-1]["kind"] == "completed"


def test_meshnet_status_shows_nodes_coverage_and_gaps(swarm: Swarm) -> None:
    live = swarm.live_workers()
    # The worker killed by the failover test stays listed (late) until it expires.
    deadline = time.monotonic() + 15
    keyless = _status(swarm, "--gateway", _base_url(swarm))
    assert keyless.returncode == 2 and "401" in keyless.stderr, keyless.stderr
    explicit = _status(swarm, "--gateway", _base_url(swarm), "--api-key", swarm.api_key)
    assert explicit.returncode == 0, explicit.stderr
    (swarm.root / "api-key").write_text(swarm.api_key + "\n")  # the default: DATA_DIR/api-key
    from_gateway = _status(swarm, "--gateway", _base_url(swarm))

    def settled(text: str) -> bool:
        return text.count(" healthy ") == len(live) and " late " not in text

    while not settled(from_gateway.stdout) and time.monotonic() < deadline:
        time.sleep(0.2)
        from_gateway = _status(swarm, "--gateway", _base_url(swarm))
    assert from_gateway.returncode == 0, from_gateway.stderr
    lines = from_gateway.stdout.splitlines()
    assert lines[1].startswith("ok: ")
    assert "coverage tiny (6 layers) [11" in lines[2] and lines[2].endswith("complete")
    for worker in live:
        assert any(line.startswith(worker.address) and "healthy" in line for line in lines), from_gateway.stdout

    for worker in swarm.live_workers("2:4"):
        worker.component.kill()
    # The tracker lists a killed node (late) until it misses enough heartbeats; then the gap shows.
    deadline = time.monotonic() + 15
    from_tracker = _status(swarm, "--tracker", swarm.tracker_address)
    while from_tracker.returncode == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
        from_tracker = _status(swarm, "--tracker", swarm.tracker_address)
    assert from_tracker.returncode == 1, from_tracker.stdout + from_tracker.stderr
    assert "coverage tiny (6 layers) [11--11] gaps 2:4" in from_tracker.stdout
    assert "no_route: no node serves layers 2:4 of 'tiny'" in from_tracker.stdout
    # The tracker's table is for operators: the default is DATA_DIR's admin identity; plaintext fails.
    plaintext = _status(swarm, "--tracker", swarm.tracker_address, "--insecure")
    assert plaintext.returncode == 2, plaintext.stdout + plaintext.stderr

    unreachable = _status(swarm, "--gateway", "http://127.0.0.1:9")
    assert unreachable.returncode == 2
    assert "cannot be reached" in unreachable.stderr
