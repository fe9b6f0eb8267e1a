"""The multi-host lab for real: namespaces, a bridge, shaped veth links, delay lines and
memory-capped cgroups (v1 or v2, whichever the host has), with a real swarm of the tiny model
inside. Skips (saying why) where the machine does not allow namespaces or has no cgroup
hierarchy with the memory and cpuset controllers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from openai import OpenAI
from swarm_harness import MODEL_NAME, PROMPT, Reference, meshnet_command, write_tiny_model

from meshnet.artifact.manifest import needed_artifacts
from meshnet.artifact.publish import PublishOptions, publish
from meshnet.core.layers import LayerRange
from meshnet.deploy.lab import cgroups
from meshnet.deploy.lab.plan import PREFIX
from meshnet.deploy.lab.system import LabUnavailable, check_privileges, run
from meshnet.security.signing import load_or_create_key

TAG = "t9"


def _lab_allowed() -> str | None:
    try:
        check_privileges()
        cgroups.detect_layout()
    except LabUnavailable as error:
        return error.message
    return None


pytestmark = pytest.mark.skipif(_lab_allowed() is not None, reason=f"no lab here: {_lab_allowed()}")


def _lab_objects() -> list[str]:
    names = run(["ip", "netns", "list"], check=False).stdout
    links = json.loads(run(["ip", "-j", "link"], check=False).stdout or "[]")
    found = [line.split()[0] for line in names.splitlines() if line.startswith(f"mnlab-{TAG}-")]
    found += [entry["ifname"] for entry in links if entry["ifname"].startswith(f"mnlab{TAG}")]
    found += [str(top) for top in cgroups.group_tops() if top.name == f"{PREFIX}-{TAG}"]
    return found


def _start_lab(tmp_path: Path, model: Path, delay_ms: float, *extra: str) -> tuple[subprocess.Popen[str], str]:
    command = meshnet_command(
        tmp_path / "data",
        *("lab", "up", "--model", str(model), "--nodes", "3", "--delay-ms", str(delay_ms)),
        *("--bandwidth-mbit", "100", "--memory-mb", "400", "--context", "512", "--sessions", "2"),
        *("--model-name", MODEL_NAME, "--tag", TAG, "--ranges", "0:2,2:4,4:6", *extra),
    )
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    lines = []
    while time.monotonic() < deadline and process.stdout is not None:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("gateway "):
            return process, line.split()[1]
    process.kill()
    raise AssertionError(f"lab never served: {''.join(lines)} {process.stderr.read() if process.stderr else ''}")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path)


def test_lab_serves_across_namespaces_and_removes_everything(tmp_path: Path, model: Path) -> None:
    reference = Reference(model, tmp_path / "ref")
    expected = reference.text(reference.generate(reference.chat_tokens(PROMPT), 24))
    process, base_url = _start_lab(tmp_path, model, delay_ms=2)
    try:
        # The gateway lives on node 0's own address inside its namespace, not on loopback.
        assert base_url.startswith("http://10.") and ":8080/v1" in base_url
        key = (tmp_path / "data" / "lab" / TAG / "n0" / "api-key").read_text().strip()
        client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)
        answer = client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}], max_tokens=24, temperature=0
        )
        assert answer.choices[0].message.content == expected
        # Every worker is bound to its node's address and sits in a capped cgroup of its own.
        for index in range(3):
            listening = run(["ip", "netns", "exec", f"mnlab-{TAG}-n{index}", "ss", "-ltn"]).stdout
            assert "10." in listening and ":7000" in listening and "127.0.0.1:7000" not in listening
            group = cgroups.node_group_name(f"{PREFIX}-{TAG}", index, "worker")
            assert int(cgroups.detect_layout().memory_limit_file(group).read_text()) == 400 * 1024 * 1024
        _a_live_lab_is_never_torn_down(tmp_path, model)
        again = client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}], max_tokens=24, temperature=0
        )
        assert again.choices[0].message.content == expected
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert _lab_objects() == []


def test_lab_workers_fetch_only_their_range_by_model_id(tmp_path: Path, model: Path) -> None:
    """``--published``: node 0 seeds what ``meshnet publish`` wrote and each worker fetches its
    range by model id (no source GGUF cut on any worker), with output equal to the whole model's."""
    key, _ = load_or_create_key(tmp_path / "publisher.key")
    manifest = publish(model, tmp_path / "published", PublishOptions("tiny-published", "test"), key)
    reference = Reference(model, tmp_path / "ref")
    expected = reference.text(reference.generate(reference.chat_tokens(PROMPT), 24))
    process, base_url = _start_lab(tmp_path, model, 0, "--published", str(tmp_path / "published"))
    try:
        key_text = (tmp_path / "data" / "lab" / TAG / "n0" / "api-key").read_text().strip()
        client = OpenAI(base_url=base_url, api_key=key_text, max_retries=0, timeout=60)
        answer = client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}], max_tokens=24, temperature=0
        )
        assert answer.choices[0].message.content == expected
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    logs = tmp_path / "data" / "lab" / TAG / "logs"
    for index, layers in enumerate((LayerRange(0, 2), LayerRange(2, 4), LayerRange(4, 6))):
        found = re.search(
            r"fetched layers \S+ of tiny-published: (\d+) bytes", (logs / f"worker-n{index}.log").read_text()
        )
        assert found is not None, f"worker-n{index} did not fetch by model id"
        needed = sum(entry.size for entry in needed_artifacts(manifest, layers))
        assert needed <= int(found[1]) < model.stat().st_size  # its range (+ protocol), never the whole file
    assert _lab_objects() == []


def test_a_sigkilled_lab_is_removed_by_the_next_down(tmp_path: Path, model: Path) -> None:
    process, _ = _start_lab(tmp_path, model, delay_ms=0)
    process.kill()
    process.wait()
    assert _lab_objects() != []
    down = subprocess.run(
        meshnet_command(tmp_path / "data", "lab", "down", "--tag", TAG), capture_output=True, text=True
    )
    assert down.returncode == 0 and "removed" in down.stdout and "namespace mnlab-t9-n0" in down.stdout
    assert _lab_objects() == []
    alive = [pid for pid in os.listdir("/proc") if pid.isdigit() and f"mnlab-{TAG}" in _cmdline(pid)]
    assert alive == []


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _a_live_lab_is_never_torn_down(tmp_path: Path, model: Path) -> None:
    """A second `lab up` with the same tag, `lab down --tag` and `lab down` all leave it running."""
    objects = _lab_objects()
    second = subprocess.run(
        meshnet_command(
            tmp_path / "second",
            *("lab", "up", "--model", str(model), "--nodes", "1", "--tag", TAG, "--model-name", MODEL_NAME),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 2 and "[lab_in_use]" in second.stderr and "in use by pid" in second.stderr
    named = subprocess.run(
        meshnet_command(tmp_path / "data", "lab", "down", "--tag", TAG), capture_output=True, text=True, timeout=60
    )
    assert named.returncode == 2 and "[lab_in_use]" in named.stderr
    every = subprocess.run(
        meshnet_command(tmp_path / "data", "lab", "down"), capture_output=True, text=True, timeout=60
    )
    assert every.returncode == 0 and f"left running: lab '{TAG}'" in every.stdout
    assert _lab_objects() == objects
