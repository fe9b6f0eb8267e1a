"""The request ledger: one log line per request, latency histograms on /metrics, the history.

The route is the scripted double of ``gateway_doubles`` (it cannot show a real route; the
browser test in tests/integration/test_status_page_browser.py does, with real workers). The
log line's wording is checked by ``log_line`` itself, and caplog sees it on a real app.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import replace
from typing import Any

import httpx
import pytest
from gateway_doubles import MODEL, Script, ScriptedGenerator, live_server, make_app, wait_until
from prometheus_client.parser import text_string_to_metric_families

from meshnet.core.events import HopLatency
from meshnet.core.ids import NodeId, RequestId
from meshnet.gateway.request_ledger import (
    RequestLedger,
    RequestRecord,
    computed_prefill,
    log_line,
    rates,
)
from meshnet.gateway.telemetry_hub import TelemetryHub
from meshnet.telemetry.history import HistoryShape
from meshnet.telemetry.prometheus import build_registry, render

pytestmark = pytest.mark.timeout(30)

RECORD = RequestRecord(
    request_id="req-1",
    key_id="k-ops",
    model="tiny",
    route=("n-a", "n-b"),
    prompt_tokens=12,
    completion_tokens=9,
    ttft_seconds=0.25,
    total_seconds=1.25,
    prefill_seconds=0.2,
    decode_seconds=0.8,
    outcome="completed",
    reason="stop",
    prefill_tokens=12,
)


def test_the_log_line_names_id_key_id_route_tokens_times_and_outcome() -> None:
    assert log_line(RECORD) == (
        "request req-1 key=k-ops model=tiny route=n-a,n-b prompt_tokens=12 completion_tokens=9 "
        "ttft=0.250s total=1.250s outcome=completed reason=stop"
    )
    refused = RequestRecord("req-2", None, "tiny", (), None, 0, None, 0.01, None, None, "failed", "overloaded")
    tail = "route=- prompt_tokens=- completion_tokens=0 ttft=- total=0.010s outcome=failed reason=overloaded"
    assert log_line(refused).endswith(tail)
    assert "key=-" in log_line(refused)


def test_prefill_counts_only_the_computed_tokens_of_one_prefill() -> None:
    cached_hit = [
        ("prefill_started", {"prompt_tokens": 1000, "cached_tokens": 960}),
        ("prefill_completed", {"prompt_tokens": 1000, "seconds": 0.1}),
    ]
    assert computed_prefill(cached_hit) == (40, 0.1)  # 400 tok/s, not the 10,000 of 1000 / 0.1
    failover = [
        ("prefill_started", {"prompt_tokens": 100, "cached_tokens": 0}),
        ("prefill_completed", {"prompt_tokens": 100, "seconds": 0.5}),
        ("prefill_started", {"prompt_tokens": 130, "cached_tokens": 0}),  # replayed onto a new route
        ("prefill_completed", {"prompt_tokens": 130, "seconds": 0.2}),
    ]
    assert computed_prefill(failover) == (100, 0.5)  # one pair's tokens over that pair's seconds
    assert computed_prefill([("prefill_started", {"prompt_tokens": 8})]) == (None, None)  # never completed
    record = replace(RECORD, prompt_tokens=1000, prefill_tokens=40, prefill_seconds=0.1)
    assert rates(record)[0] == pytest.approx(400.0)


def test_rates_are_measured_from_the_request() -> None:
    assert rates(RECORD) == (60.0, 10.0)  # 12 prompt tokens in 0.2 s; 8 gaps in 0.8 s
    one_token = RequestRecord("r", None, "m", (), 3, 1, 0.1, 0.1, None, None, "completed", "length")
    assert rates(one_token) == (None, None)


async def test_a_request_logs_one_line_and_feeds_histograms_and_history(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="meshnet.gateway.requests")
    generator = ScriptedGenerator(Script(text="hello there"))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "stream": True}
    ticks = iter(range(1_000_000))
    app = make_app(generator, clock=lambda: 0.01 * next(ticks), history_bucket_seconds=1.0)  # each read: 10 ms on
    async with live_server(app) as base, httpx.AsyncClient() as http:
        response = await http.post(f"{base}/v1/chat/completions", json=body)
        metrics = (await http.get(f"{base}/metrics")).text
        history = (await http.get(f"{base}/v1/status/history")).json()
    request_id = response.headers["x-request-id"]
    lines = [r.getMessage() for r in caplog.records if r.name == "meshnet.gateway.requests"]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"request {request_id} key=- model={MODEL} route=")
    # 11 tokens of text and the EOS, as usage counts them.
    assert "completion_tokens=12" in lines[0] and "outcome=completed reason=stop" in lines[0]
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    counts = {s.name: s.value for f in families.values() for s in f.samples if s.name.endswith("_count")}
    assert counts["meshnet_gateway_time_to_first_token_seconds_count"] == 1
    assert counts["meshnet_gateway_inter_token_seconds_count"] == 10  # 11 tokens, 10 gaps
    assert families["meshnet_gateway_request_duration_seconds"].type == "histogram"
    series = history["series"]
    assert sum(p["count"] for p in series["requests"][""]) == 1
    assert set(series["decode_tokens_per_s"]) == set(series["inter_token_seconds"]) != set()
    assert "queued" in series and "in_flight" in series


async def test_a_request_refused_at_once_still_gets_its_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="meshnet.gateway.requests")
    gate = asyncio.Event()
    generator = ScriptedGenerator(Script(gate=gate, gate_after_tokens=1))
    app = make_app(generator, max_in_flight=1, max_queue=0)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "stream": True}
    async with live_server(app) as base, httpx.AsyncClient(timeout=10) as http:
        url = f"{base}/v1/chat/completions"
        busy = asyncio.create_task(http.post(url, json=body))
        await wait_until(lambda: len(generator.requests) == 1)
        refused = await http.post(url, json=body)
        busy_history = (await http.get(f"{base}/v1/status/history")).json()["series"]
        gate.set()
        served = await busy
    assert (refused.status_code, served.status_code) == (503, 200)
    lines = [r.getMessage() for r in caplog.records if r.name == "meshnet.gateway.requests"]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"request {refused.headers['x-request-id']} ")
    refusal = "route=- prompt_tokens=- completion_tokens=0 ttft=- total=0.000s outcome=failed reason=overloaded"
    assert lines[0].endswith(refusal)
    assert lines[1].startswith(f"request {served.headers['x-request-id']} ") and "outcome=completed" in lines[1]
    assert len(app.state.hub) == 1, "the refusal keeps no telemetry log"
    # Admission's gauges were sampled as the requests came: one in flight while the other was refused.
    assert max(point["max"] for point in busy_history["in_flight"][""]) == 1


def test_latest_rates_are_each_nodes_newest_bucket() -> None:
    now = [0.0]
    ledger = RequestLedger(HistoryShape(bucket_seconds=1.0, bucket_count=10), lambda: now[0])
    ledger.finished(RECORD)  # 60 prefill, 10 decode tok/s on n-a and n-b
    now[0] = 3.5
    ledger.finished(dataclasses.replace(RECORD, route=("n-a",), decode_seconds=0.4))  # 20 decode tok/s
    assert ledger.latest_rates() == {
        "n-a": {"prefill_tokens_per_s": 60.0, "decode_tokens_per_s": 20.0},
        "n-b": {"prefill_tokens_per_s": 60.0, "decode_tokens_per_s": 10.0},
    }
    now[0] = 20.0  # everything left the 10 s window
    assert ledger.latest_rates() == {}


def test_the_hub_times_each_token_once_and_records_the_route() -> None:
    now = [0.0]
    ledger = RequestLedger(HistoryShape(bucket_seconds=1.0, bucket_count=10), lambda: now[0])
    hub = TelemetryHub(max_requests=4, max_events_per_request=16, clock=lambda: now[0], ledger=ledger)
    rid = RequestId("req-t")
    hub.open(rid, "tiny", owner="k-1")
    hub.publish(rid, "accepted", {"hops": [{"node_id": "n-a"}, {"node_id": "n-b"}]})
    for at, generated in [(0.2, 1), (0.3, 2), (0.5, 3), (0.5, 3)]:  # the last: text flushed at the end
        now[0] = at
        hub.token(rid, generated)
    hub.publish(rid, "completed", {"finish_reason": "stop", "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
    (gaps,) = ledger.inter_token.series()
    assert (gaps.count, round(gaps.total, 6)) == (2, 0.3)
    (ttft,) = ledger.ttft.series()
    assert ttft.total == 0.2
    history: Any = ledger.history.as_json(now[0])["series"]
    assert sorted(history["inter_token_seconds"]) == ["n-a", "n-b"]
    assert history["decode_tokens_per_s"]["n-a"][0]["mean"] == round(2 / 0.3, 6)


def test_hop_times_go_to_the_per_node_histogram_and_history_with_bounded_labels() -> None:
    now = [0.0]
    ledger = RequestLedger(HistoryShape(bucket_seconds=1.0, bucket_count=10, max_labels=2), lambda: now[0])
    hub = TelemetryHub(max_requests=4, max_events_per_request=16, clock=lambda: now[0], ledger=ledger)
    hub.hop_times((HopLatency(NodeId("n-a"), 0.004), HopLatency(NodeId("n-b"), 0.02)))
    now[0] = 1.5
    hub.hop_times((HopLatency(NodeId("n-a"), 0.006), HopLatency(NodeId("n-c"), 0.5)))
    series = {one.label: one for one in ledger.hop.series()}
    # Past max_labels node ids the histogram folds new ones into "other"; the history drops the oldest.
    assert sorted(series) == ["n-a", "n-b", "other"]
    assert (series["n-a"].count, round(series["n-a"].total, 6)) == (2, 0.01)
    assert dict(series["n-a"].cumulative)["0.005"] == 1 and dict(series["n-a"].cumulative)["0.01"] == 2
    history: Any = ledger.history.as_json(now[0])["series"]["hop_seconds"]
    assert sorted(history) == ["n-a", "n-c"]
    assert [point["mean"] for point in history["n-a"]] == [0.004, 0.006]
    # The exposition is Prometheus' histogram, by node.
    registry = build_registry("meshnet_gateway", dict, histograms=ledger.histograms)
    (family,) = [f for f in text_string_to_metric_families(render(registry).decode()) if f.name.endswith("hop_seconds")]
    assert family.name == "meshnet_gateway_hop_seconds" and family.type == "histogram"
    counts = {s.labels["node"]: s.value for s in family.samples if s.name.endswith("_count")}
    assert counts == {"n-a": 2.0, "n-b": 1.0, "other": 1.0}
