"""The status document, the lost-node memory, the terminal table and the routes.

The node table is a fixed view and the route the scripted double of ``gateway_doubles``; the
status of a live swarm (real workers killed, gaps appearing) is
tests/integration/test_prefill_progress.py and test_status_page_browser.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import httpx
import pytest
from gateway_doubles import MODEL, ByteCodec, ScriptedGenerator
from gateway_doubles import test_config as gateway_config
from status_samples import node, table

from meshnet.core.errors import Unavailable
from meshnet.core.ids import RequestId
from meshnet.core.swarm_status import NodeTable, judge_health
from meshnet.core.tracking import NodeLoad, PrefixFigures
from meshnet.gateway.app import create_app
from meshnet.gateway.status.table import exit_status, render_status, tracker_health
from meshnet.gateway.status.view import NodeMemory, StatusInputs, status_document
from meshnet.gateway.telemetry_hub import TelemetryHub
from meshnet.wire import status_wire


def test_a_vanished_node_is_lost_for_a_while_then_forgotten() -> None:
    memory = NodeMemory(kept_seconds=10.0)
    a, b = node("0:3"), node("3:6")
    assert memory.update(table(a, b), now=0.0) == ()
    assert memory.update(table(a), now=1.0) == ((b, 1.0),)
    assert memory.update(table(a), now=5.0) == ((b, 1.0),)
    assert memory.update(table(a), now=11.5) == ()
    assert memory.update(table(a, b), now=12.0) == ()


def _hub_with_requests() -> TelemetryHub:
    hub = TelemetryHub(max_requests=8, max_events_per_request=64, clock=lambda: 0.0)
    for name in ("live", "done", "broken"):
        hub.open(RequestId(f"req-{name}"), MODEL)
        hub.publish(RequestId(f"req-{name}"), "accepted", {"hops": [{"address": "a:1", "layers": "0:6"}]})
        hub.publish(RequestId(f"req-{name}"), "prefill_started", {"prompt_tokens": 100})
    live = RequestId("req-live")
    hub.publish(live, "prefill_progress", {"done_tokens": 40, "total_tokens": 100, "eta_seconds": 1.5})
    hub.publish(live, "route_health", {"status": "failover", "reason": "lost"})
    hub.publish(RequestId("req-done"), "completed", {"usage": {"prompt_tokens": 100, "completion_tokens": 5}})
    hub.publish(RequestId("req-broken"), "failed", {"code": "no_route", "message": "gone"})
    return hub


def test_the_document_has_nodes_coverage_requests_errors_and_totals() -> None:
    hub = _hub_with_requests()
    nodes = table(node("0:3"), node("3:6"))
    document = status_document(
        StatusInputs(
            model="tiny",
            table=nodes,
            tracker_error="",
            lost=((node("3:6", fingerprint="f1", node_id="n-old"), 0.0),),
            health=judge_health("tiny", nodes),
            requests=hub.recent(10),
            admission={"in_flight": 1.0},
            totals=hub.totals,
            now=0.0,
        )
    )
    assert document["health"]["status"] == "ok"
    assert [n["health"] for n in document["nodes"]] == ["healthy", "healthy", "lost"]
    assert document["coverage"][0]["counts"] == [1] * 6
    (live,) = document["requests"]
    assert (live["request_id"], live["phase"], live["prefill_done_tokens"], live["prompt_tokens"]) == (
        "req-live",
        "failover",
        40,
        100,
    )
    assert (live["prefill_eta_seconds"], live["failovers"], live["route"]) == (1.5, 1, ["a:1 [0:6]"])
    assert {r["request_id"] for r in document["recent_requests"]} == {"req-done", "req-broken"}
    broken = {"request_id": "req-broken", "age_seconds": 0.0, "code": "no_route", "message": "gone"}
    assert document["errors"] == [broken]
    assert document["billing"]["completion_tokens_total"] == 5.0


def test_the_terminal_table_shows_coverage_gaps_nodes_and_its_exit_status() -> None:
    nodes = table(node("0:2"), node("4:6", beat=2.0))
    document = status_document(StatusInputs("tiny", nodes, "", (), tracker_health(nodes), (), {}, {}, 0.0))
    text = render_status(document, "tracker 127.0.0.1:7070")
    lines = text.splitlines()
    assert lines[0] == "meshnet status of tracker 127.0.0.1:7070, epoch 3"
    assert lines[1].startswith("no_route: no node serves layers 2:4 of 'tiny'")
    assert lines[2] == "coverage tiny (6 layers) [11--11] gaps 2:4"
    header = ["NODE", "REACHABILITY", "LAYERS", "HEALTH", "HEARTBEAT", "SESSIONS", "QUEUE", "KV", "MEMORY", "DEVICE"]
    assert lines[3].split() == [*header, "PREFILL/s", "DECODE/s", "PREFIX"]
    assert lines[4].split()[:5] == ["127.0.0.1:7000", "public", "0:2/6", "healthy", "0.1s"]
    assert lines[5].split()[:5] == ["127.0.0.1:7004", "public", "4:6/6", "late", "2.0s"]
    assert lines[4].split()[9] == "cpu"
    assert exit_status(document) == 1


def test_each_node_shows_its_prefix_store_where_it_reports_one() -> None:
    figures = PrefixFigures(bytes_held=3 << 20, budget_bytes=8 << 20, hits=5, misses=2)
    nodes = table(node("0:3", load=NodeLoad(1, 7, prefix=figures)), node("3:6"))
    document = status_document(StatusInputs("tiny", nodes, "", (), tracker_health(nodes), (), {}, {}, 0.0))
    reported, silent = document["nodes"]
    assert (reported["prefix_bytes"], reported["prefix_budget_bytes"]) == (3 << 20, 8 << 20)
    assert (reported["prefix_hits"], reported["prefix_misses"]) == (5, 2)
    assert silent["prefix_budget_bytes"] is None
    lines = render_status(document, "tracker").splitlines()
    assert lines[3].split()[-1] == "PREFIX"
    assert lines[4].split()[-1] == "3.0M/8.0M,5/7hit" and lines[5].split()[-1] == "-"


def test_a_gpu_node_shows_its_device_and_device_memory() -> None:
    """A GPU node's device memory (weights, KV and buffers of every process on it) next to its total."""
    cpu = node("0:3")
    capability = replace(
        cpu.record.capability,
        device="vulkan",
        device_name="llvmpipe (LLVM 15.0.6, 256 bits)",
        device_memory_total=8 << 30,
        device_memory_free=6 << 30,
    )
    gpu = node("3:6", record=replace(node("3:6").record, capability=capability))
    document = status_document(
        StatusInputs("tiny", table(cpu, gpu), "", (), tracker_health(table(cpu, gpu)), (), {}, {}, 0.0)
    )
    shown = {n["address"]: n for n in document["nodes"]}
    assert shown[gpu.record.address]["device_memory_used"] == 2 << 30
    assert shown[gpu.record.address]["device_name"].startswith("llvmpipe")
    rows = render_status(document, "tracker").splitlines()
    assert any(row.split()[0] == gpu.record.address and "vulkan" in row.split() for row in rows)


@dataclass
class FixedView:
    """A SwarmView over a fixed table (or a tracker that cannot be reached)."""

    nodes: NodeTable | None
    context: int | None = 128

    async def node_table(self) -> NodeTable:
        if self.nodes is None:
            raise Unavailable("tracker 127.0.0.1:1: connection refused")
        return self.nodes

    async def route_context(self, model: str) -> int | None:
        return self.context


def _codecs() -> tuple[dict[str, ByteCodec], object]:
    return {MODEL: ByteCodec()}, gateway_config()


@pytest.mark.parametrize(
    ("nodes", "status", "code"),
    [
        (table(node("0:6", model=MODEL)), "ok", 200),
        (table(node("0:6", model=MODEL, beat=5.0)), "degraded", 200),
        (table(node("0:2", model=MODEL)), "no_route", 503),
        (None, "no_route", 503),
    ],
)
async def test_health_says_whether_a_complete_route_exists(nodes: NodeTable | None, status: str, code: int) -> None:
    app = create_app(ScriptedGenerator(), *_codecs(), view=FixedView(nodes))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        response = await http.get("/health")
    assert (response.status_code, response.json()["status"]) == (code, status)
    if status == "no_route" and nodes is not None:
        assert response.json()["missing_layers"] == [[2, 6]]


async def test_models_report_the_context_a_session_gets_on_the_route() -> None:
    app = create_app(ScriptedGenerator(), *_codecs(), view=FixedView(table(node("0:6", model=MODEL)), context=128))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        listed = (await http.get("/v1/models")).json()["data"]
        one = await http.get(f"/v1/models/{MODEL}")
        missing = await http.get("/v1/models/nope")
    assert [m["context_length"] for m in listed] == [128]  # the codec alone would say 256
    assert one.json()["context_length"] == 128
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


async def test_the_page_its_files_and_the_status_document_are_served() -> None:
    app = create_app(ScriptedGenerator(), *_codecs(), view=FixedView(table(node("0:6", model=MODEL))))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        for path in ("/", "/status"):
            page = await http.get(path)
            assert page.status_code == 200 and "/status/status.js" in page.text
        assert (await http.get("/status/status.js")).headers["content-type"].startswith("text/javascript")
        assert (await http.get("/status/other.js")).status_code == 404
        document = (await http.get("/v1/status")).json()
    assert document["health"]["status"] == "ok" and len(document["nodes"]) == 1


async def test_a_prompt_is_held_to_the_context_the_models_list_shows() -> None:
    """The route's context, not the model's own, bounds a prompt: /v1/models and the refusal agree."""
    app = create_app(ScriptedGenerator(), *_codecs(), view=FixedView(table(node("0:6", model=MODEL)), context=128))
    body = {"model": MODEL, "prompt": "x" * 200, "max_tokens": 1}  # under the codec's 256, over the route's 128
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        shown = (await http.get(f"/v1/models/{MODEL}")).json()["context_length"]
        refused = await http.post("/v1/completions", json=body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert f"context holds {shown}" in refused.json()["error"]["message"] and shown == 128


def test_a_relayed_node_names_its_relay_and_a_private_one_says_it_is_behind_nat_and_covers_nothing() -> None:
    relayed = node("0:3", reachability="relayed")
    relayed = replace(relayed, record=replace(relayed.record, address="n-home@relay.example:7400"))
    private = node("3:6", reachability="private")
    nodes = table(relayed, private)
    document = status_document(StatusInputs("tiny", nodes, "", (), tracker_health(nodes), (), {}, {}, 0.0))
    assert [(n["reachability"], n["reachable"]) for n in document["nodes"]] == [
        ("relayed", "relayed via relay.example:7400"),
        ("private", "private: behind NAT, no relay attached"),
    ]
    assert document["coverage"][0]["counts"] == [1, 1, 1, 0, 0, 0]  # nobody can dial the private one
    assert document["health"]["status"] == "no_route"
    lines = render_status(document, "tracker").splitlines()
    assert lines[4].split()[:2] == ["n-home@relay.example:7400", "relay:relay.example:7400"]
    assert lines[5].split()[:2] == ["127.0.0.1:7003", "private"]
    assert lines[6] == "127.0.0.1:7003 is private: behind NAT, no relay attached (not routed)"
    assert status_wire.node_table_from_proto(status_wire.node_table_to_proto(nodes)) == nodes


def test_a_node_row_carries_its_live_rates_beside_the_probe() -> None:
    nodes = table(node("0:3", node_id="n-a"), node("3:6", node_id="n-b"))
    live = {"n-a": {"prefill_tokens_per_s": 120.0, "decode_tokens_per_s": 30.0}}
    inputs = StatusInputs("tiny", nodes, "", (), tracker_health(nodes), (), {}, {}, 0.0, live=live)
    by_id = {n["node_id"]: n for n in status_document(inputs)["nodes"]}
    assert (by_id["n-a"]["live_prefill_tokens_per_s"], by_id["n-a"]["live_decode_tokens_per_s"]) == (120.0, 30.0)
    assert (by_id["n-b"]["live_prefill_tokens_per_s"], by_id["n-b"]["live_decode_tokens_per_s"]) == (None, None)
    assert by_id["n-b"]["decode_tokens_per_s"] == nodes.nodes[1].record.capability.decode_tokens_per_s
