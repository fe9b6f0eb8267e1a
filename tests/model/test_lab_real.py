"""The product's claim on one machine: SmolLM2 served by three namespaced nodes, each capped
below what the whole model needs, over shaped links with delay; greedy output identical to the
whole model; a killed worker fails over to the spare with identical output; a link taken down
(the node still alive) ends in failover or a structured error within 5 s, never a hang; and the
lab leaves nothing behind.

Needs root (namespaces, cgroups) and MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 with SmolLM2.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from smollm2_model import ENABLED, ENABLED_MARK, MODEL
from swarm_harness import Reference, active_sessions, query_db, wait_sessions_freed

from meshnet.artifact.describe import describe_model
from meshnet.core.errors import MeshnetError
from meshnet.core.layer_costs import WorkerLoad
from meshnet.core.layers import LayerRange
from meshnet.core.swarm_status import node_health
from meshnet.deploy.lab import cgroups, system
from meshnet.deploy.lab.lab import Lab, LabConfig
from meshnet.deploy.lab.swarm import LabSwarm, admin_security, ca_dir, client_auth, restart_tracker, start_swarm
from meshnet.deploy.lab.sweep import measure_point
from meshnet.deploy.launch.commands import minted_identity, worker_command
from meshnet.deploy.launch.ready_lines import WorkerLine
from meshnet.membership.tracker_client import TrackerClient
from meshnet.node.auto_layers import model_costs
from meshnet.node.config import LayerChoice, WorkerConfig
from meshnet.process.launcher import StartupFailed
from meshnet.tracker.config import DEFAULT_DB_NAME
from meshnet.tracker.placement import plan_ranges
from meshnet.wire.tls import LinkSecurity

CAP_MB = 220
"""The smallest round cap at which three nodes hold SmolLM2 (one 2,048-position session each) by
the memory cost model (a one-layer tail counts 220 MiB); the whole model counts 324 MiB."""
FORCED_CHARGE_BYTES = 64 * 4096
"""How far a group's recorded peak may pass its cap: one memcg charge batch (64 pages). Two nodes
sit at their cap, reclaiming page cache, and now and then the kernel forces a charge it may not
fail; the high watermark records it (measured: 160 MiB + 4 KiB, in 2 of 16 runs). The cap itself
is the kernel's; what this test holds is no OOM kill and no peak past the cap and that batch."""
PROMPT = "Write one sentence about the sea."
TOKENS = 48


def _no_lab_reason() -> str | None:
    try:
        system.check_privileges()
        cgroups.detect_layout()
    except system.LabUnavailable as error:
        return error.message
    return None


pytestmark = [
    pytest.mark.real_model,
    pytest.mark.timeout(300),
    ENABLED_MARK,
    pytest.mark.skipif(ENABLED and not MODEL.exists(), reason=f"{MODEL} is not provisioned"),
    pytest.mark.skipif(_no_lab_reason() is not None, reason=f"no lab here: {_no_lab_reason()}"),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, LabSwarm]]:
    config = LabConfig(
        model=MODEL,
        data_dir=tmp_path_factory.mktemp("lab"),
        nodes=3,
        spares=1,
        delay_ms=2,
        bandwidth_mbit=100,
        memory_mb=CAP_MB,
        context=2048,
        sessions=1,
        model_name="smol",
        tag="real",
    )
    lab = Lab(config)
    try:
        lab.build()
        yield lab, start_swarm(lab)
    finally:
        lab.close()
    # Nothing of the lab remains: namespaces, veths, the bridge, cgroups (v1 and v2 layouts).
    assert _lab_objects("real") == []


def _lab_objects(tag: str) -> list[str]:
    namespaces = system.run(["ip", "netns", "list"], check=False).stdout.split()
    links = json.loads(system.run(["ip", "-j", "link"], check=False).stdout or "[]")
    found = [name for name in namespaces if name.startswith(f"mnlab-{tag}-")]
    found += [entry["ifname"] for entry in links if entry["ifname"].startswith(f"mnlab{tag}")]
    found += [str(top) for top in cgroups.group_tops() if top.name == f"mnlab-{tag}"]
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reference]:
    whole = Reference(MODEL, tmp_path_factory.mktemp("ref"))
    try:
        yield whole
    finally:
        whole.close()


@pytest.fixture(scope="module")
def expected(reference: Reference) -> str:
    return reference.text(reference.generate(reference.chat_tokens(PROMPT), TOKENS))


def test_the_whole_model_does_not_fit_one_node() -> None:
    costs = model_costs(MODEL, WorkerLoad(sessions=1, context=2048, prefill_chunk=WorkerConfig.prefill_chunk))
    with pytest.raises(Exception, match="does not fit these 1 nodes"):
        plan_ranges(costs, [CAP_MB * 2**20])
    assert len(plan_ranges(costs, [CAP_MB * 2**20] * 3)) == 3


def _key(swarm: LabSwarm) -> str:
    return swarm.api_key_path.read_text().strip()


def _auth(swarm: LabSwarm) -> dict[str, str]:
    return client_auth(swarm)


@dataclass
class Streamed:
    """One streamed chat completion as the client saw it."""

    text: str = ""
    events: list[dict[str, object]] = field(default_factory=list)
    """Telemetry events, each with ``received`` (time.monotonic() when its line was read)."""
    error: str | None = None
    """The code of a streamed error event, if one came."""
    done: bool = False
    """Whether ``data: [DONE]`` ended the stream."""

    def of_kind(self, kind: str) -> list[dict[str, object]]:
        return [event for event in self.events if event["kind"] == kind]


def _stream(swarm: LabSwarm, on_token: object = None) -> Streamed:
    body = {
        "model": "smol",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": TOKENS,
        "temperature": 0,
        "stream": True,
    }
    seen, count = Streamed(), 0
    url = f"{swarm.gateway_url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=_auth(swarm), timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith(": telemetry "):
                event = json.loads(line[len(": telemetry ") :])
                event["received"] = time.monotonic()
                seen.events.append(event)
            elif line == "data: [DONE]":
                seen.done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    seen.error = chunk["error"]["code"]
                    continue
                for choice in chunk["choices"]:
                    piece = choice["delta"].get("content") or ""
                    seen.text += piece
                    count += bool(piece)
                    if callable(on_token):
                        on_token(count, seen.events)
    return seen


def _middle_node(swarm: LabSwarm, events: list[dict[str, object]]) -> int:
    """The node whose worker serves the middle hop of the route the gateway accepted."""
    accepted = next(e for e in events if e["kind"] == "accepted")
    address = accepted["hops"][1]["address"]  # type: ignore[index]
    return next(index for index, advertised in swarm.advertised.items() if advertised == address)


def test_capped_nodes_serve_the_whole_model_output(lab: tuple[Lab, LabSwarm], expected: str) -> None:
    the_lab, swarm = lab
    seen = _stream(swarm)
    assert seen.error is None and seen.text == expected
    hops = seen.of_kind("accepted")[0]["hops"]
    assert [h["layers"] for h in hops] == [str(swarm.ranges[i]) for i in range(3)] or len(hops) == 3
    for index, (peak, kills) in the_lab.worker_memory().items():
        assert kills == 0 and peak <= CAP_MB * 2**20 + FORCED_CHARGE_BYTES, (index, peak)


PROMPTS = (
    "Write one sentence about the sea.",
    "Name three colours.",
    "What is two plus two?",
    "Say hello in French.",
    "Describe a cat in five words.",
    "Give me a word that rhymes with moon.",
    "What day comes after Monday?",
    "List two fruits.",
)
SHORT = 24


def _chat(swarm: LabSwarm, prompt: str, tokens: int) -> str:
    body = {"model": "smol", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0}
    reply = httpx.post(f"{swarm.gateway_url}/v1/chat/completions", json=body, timeout=300, headers=_auth(swarm))
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def test_the_official_openai_client_against_the_capped_lab(lab: tuple[Lab, LabSwarm], expected: str) -> None:
    _, swarm = lab
    client = OpenAI(base_url=f"{swarm.gateway_url}/v1", api_key=_key(swarm), max_retries=0, timeout=120)
    answer = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": PROMPT}], max_tokens=TOKENS, temperature=0
    )
    assert answer.choices[0].message.content == expected
    assert [model.id for model in client.models.list()] == ["smol"]


def test_eight_concurrent_sessions_each_equal_their_solo_output(
    lab: tuple[Lab, LabSwarm], reference: Reference
) -> None:
    # Each capped node holds one 2,048-position session, so the gateway queues what the route
    # cannot hold yet: all eight are in flight at once, and none may see another's tokens.
    _, swarm = lab
    solo = [reference.text(reference.generate(reference.chat_tokens(p), SHORT)) for p in PROMPTS]
    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        together = list(pool.map(lambda prompt: _chat(swarm, prompt, SHORT), PROMPTS))
    assert together == solo


def test_one_sweep_point_measures_the_lab_it_is_given(lab: tuple[Lab, LabSwarm]) -> None:
    # `meshnet lab sweep` measures through the same secured gateway and mTLS metrics as a user
    # and an operator would; one point on this lab shows it still can (the grid itself is a bench).
    the_lab, swarm = lab
    point = measure_point(the_lab, swarm, describe_model(MODEL).n_embd)
    assert point.per_token_ms > 0 and point.compute_ms > 0 and point.ttft_ms > 0
    assert point.prefill_prompt_tokens > 400
    assert point.prefill_seam_bytes >= point.prefill_seam_payload_bytes  # the hidden rows cross the tail's link


def _admin(the_lab: Lab) -> LinkSecurity:
    """The test's own admin identity: the workers' metrics are mTLS like every lab link."""
    return admin_security(the_lab, "lab-test")


def test_cancellation_frees_kv_on_every_node(lab: tuple[Lab, LabSwarm]) -> None:
    the_lab, swarm = lab
    admin = _admin(the_lab)
    body = {"model": "smol", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 400, "stream": True}
    pieces = 0
    with httpx.stream(
        "POST", f"{swarm.gateway_url}/v1/chat/completions", json=body, timeout=60, headers=_auth(swarm)
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            pieces += line.startswith("data: ")
            if pieces == 6:
                assert max(active_sessions(list(swarm.advertised.values()), admin)) == 1  # KV held mid-stream
                break  # the client goes away mid-decode: the gateway cancels the route
    wait_sessions_freed(list(swarm.advertised.values()), within_s=10.0, security=admin)


def test_the_whole_model_under_the_same_cap_is_killed(lab: tuple[Lab, LabSwarm]) -> None:
    the_lab, _ = lab
    plan = the_lab.plan
    assert plan is not None
    node = plan.spares()[0]
    groups = the_lab.add_group(node, "whole")
    whole = WorkerConfig(
        model=MODEL,
        layer_choice=LayerChoice(LayerRange(0, 30)),
        data_dir=the_lab.node_data_dir(node) / "whole",
        mmap=False,
        host=node.address,
        port=7003,
        threads=1,
        n_ctx_per_session=2048,
        max_sessions=1,
    )
    command = worker_command(whole, minted_identity(ca_dir(the_lab), "whole-model", "worker"))
    # Without --no-mmap the weights stay file-backed pages the kernel drops under pressure, so
    # the whole model would "fit" any cap; copied into the process, every byte counts.
    with pytest.raises(StartupFailed, match="exited during start-up"):
        the_lab.start(node, "whole-model", command, WorkerLine.PREFIX, role="whole")
    assert cgroups.oom_kills(groups) >= 1
    assert cgroups.peak_memory_bytes(groups) >= CAP_MB * 2**20 * 0.95


def _completed(db: Path) -> set[str]:
    return {row[0] for row in query_db(db, "SELECT request_id FROM work_records WHERE status = 'completed'")}


def _wait_recorded(db: Path, more_than: set[str]) -> set[str]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        records = _completed(db) if db.exists() else set()
        if records > more_than:
            return records
        time.sleep(0.2)
    raise AssertionError(f"no new completed work record after {sorted(more_than)}")


def test_restarting_the_tracker_loses_no_completed_work_record(lab: tuple[Lab, LabSwarm], expected: str) -> None:
    the_lab, swarm = lab
    plan = the_lab.plan
    assert plan is not None
    db = the_lab.node_data_dir(plan.nodes[0]) / DEFAULT_DB_NAME
    prior = _completed(db)
    assert _chat(swarm, PROMPT, TOKENS) == expected
    before = _wait_recorded(db, prior)
    restart_tracker(the_lab)  # SIGKILL: nothing gets a clean shutdown
    deadline = time.monotonic() + 30
    body = {"model": "smol", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": TOKENS, "temperature": 0}
    while True:  # the workers re-register within a heartbeat or two
        reply = httpx.post(f"{swarm.gateway_url}/v1/chat/completions", json=body, timeout=120, headers=_auth(swarm))
        if reply.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == expected
    after = _wait_recorded(db, before)
    assert before < after


LINK_DOWN_ENDS_WITHIN_S = 5.0
"""The README's promise for a node whose link goes down with its process alive."""


def test_a_link_taken_down_ends_within_5_s(lab: tuple[Lab, LabSwarm], expected: str) -> None:
    # The status contract (reliability.md) for a worker lost mid-stream: fail over, or, only
    # if recovery fails, the SSE error `worker_lost` (UNAVAILABLE) and [DONE]; within 5 s
    # either way. Any other outcome (another error, a hang, a text unlike the whole model's)
    # fails, whichever branch the route took.
    the_lab, swarm = lab
    plan = the_lab.plan
    assert plan is not None
    # One KV slot per node: start only once the earlier tests' sessions are all released.
    wait_sessions_freed(list(swarm.advertised.values()), within_s=30.0, security=_admin(the_lab))
    down_at: list[float] = []
    cut_nodes: list[int] = []

    def cut(count: int, events: list[dict[str, object]]) -> None:
        if count == 8 and not down_at:
            cut_nodes.append(_middle_node(swarm, events))
            system.set_link(plan.nodes[cut_nodes[0]], up=False)
            down_at.append(time.monotonic())

    try:
        seen = _stream(swarm, cut)
        ended = time.monotonic()
    finally:
        for index in cut_nodes:
            system.set_link(plan.nodes[index], up=True)
    assert down_at, f"the stream ended before the link went down: {seen}"
    assert seen.done, f"the stream did not end with [DONE]: {seen}"
    if seen.error is not None:
        assert seen.error == "worker_lost", f"a lost link must end as worker_lost, got {seen.error!r}: {seen.events}"
        assert not seen.of_kind("completed"), seen.events
        waited = ended - down_at[0]
    else:
        assert [e["status"] for e in seen.of_kind("route_health")] == ["failover"], seen.events
        replacement = seen.of_kind("accepted")[-1]["hops"]
        assert replacement[1]["address"] != swarm.advertised[cut_nodes[0]], "the route kept the cut node"  # type: ignore[index]
        assert seen.text == expected  # the spare continued with identical output
        waited = float(seen.of_kind("route_health")[0]["received"]) - down_at[0]  # type: ignore[arg-type]
    assert waited <= LINK_DOWN_ENDS_WITHIN_S, f"the {seen.error or 'failover'} came {waited:.1f} s after the cut"


def _wait_every_node_healthy(the_lab: Lab, swarm: LabSwarm, within_s: float = 60.0) -> None:
    """Until the tracker lists every node's worker with its heartbeats on time (a node whose link
    was down comes back on its next heartbeats), so a route and a spare for it can be chosen.

    A precondition, not a promise under test: alone a cut node is healthy again 0.4-3.7 s after
    its link returns (measured after 4-20 s cuts), but under the full suite's load it once took
    longer than 30 s; the message then names each node's heartbeat age and the workers' logs.
    A poll that fails is only noted: right after a link returns, a fresh connection to the
    tracker was seen to fail its TLS handshake once ("Endpoint closing")."""
    admin = _admin(the_lab)

    async def heartbeat_ages() -> dict[str, tuple[float, bool]]:
        async with TrackerClient(swarm.tracker, timeout_s=2.0, security=admin) as client:
            table = await client.list_nodes()
        interval = table.heartbeat_interval_s
        return {
            node.record.address: (node.seconds_since_heartbeat, node_health(node, interval) == "healthy")
            for node in table.nodes
        }

    started = time.monotonic()
    errors: list[str] = []
    ages: dict[str, tuple[float, bool]] = {}
    while not all(ages.get(address, (0.0, False))[1] for address in swarm.advertised.values()):
        if time.monotonic() - started > within_s:
            logs = {c.name: _log_tail(c.spec.log_path) for c in the_lab.components if c.name.startswith("worker-")}
            raise AssertionError(
                f"nodes not all healthy after {within_s:.0f} s: (age, healthy) {ages} of {swarm.advertised}; "
                f"failed polls {errors}; worker logs: {logs}"
            )
        time.sleep(0.2)
        try:
            ages = asyncio.run(heartbeat_ages())
        except MeshnetError as error:
            errors.append(f"{time.monotonic() - started:.1f} s: {error}")


def _log_tail(path: Path, lines: int = 25) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


def test_a_killed_worker_fails_over_to_the_spare(lab: tuple[Lab, LabSwarm], expected: str) -> None:
    the_lab, swarm = lab
    _wait_every_node_healthy(the_lab, swarm)  # the cut node's link is back (previous test)
    wait_sessions_freed(list(swarm.advertised.values()), within_s=30.0, security=_admin(the_lab))
    victims: list[int] = []

    def kill(count: int, events: list[dict[str, object]]) -> None:
        if count == 8 and not victims:
            victims.append(_middle_node(swarm, events))
            worker = next(c for c in the_lab.components if c.name == f"worker-n{victims[0]}")
            worker.send_signal(signal.SIGKILL)

    seen = _stream(swarm, kill)
    assert victims
    assert seen.error is None, seen.events
    assert seen.of_kind("route_health")
    assert seen.text == expected
