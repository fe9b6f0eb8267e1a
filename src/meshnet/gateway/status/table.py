"""``meshnet status``: the status page's facts as a terminal table, from a gateway or a tracker.

From a gateway it reads ``/v1/status`` (the page's own document: nodes, coverage, requests);
from a tracker it asks ``SwarmStatus.ListNodes`` and builds the same document without the
gateway's parts. ``render_status`` is a pure function of that document, so both agree with
the page.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from meshnet.core.errors import FailedPrecondition, MeshnetError, NoRoute, Unavailable, Unreachable
from meshnet.core.swarm_status import NodeTable, SwarmHealth, coverage, judge_health
from meshnet.gateway.status.view import StatusInputs, status_document
from meshnet.membership.tracker_client import TrackerClient
from meshnet.wire.tls import LinkSecurity

TIMEOUT_S = 5.0
SEVERITY = {"ok": 0, "degraded": 1, "no_route": 2}


def fetch_from_gateway(base_url: str, api_key: str | None = None, *, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    url = base_url.rstrip("/") + "/v1/status"
    headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
    try:
        response = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as error:
        raise Unreachable(f"the gateway at {base_url} cannot be reached: {error}") from error
    if response.status_code != 200:
        raise FailedPrecondition(f"{url} answered {response.status_code}: {response.text[:200]}")
    document: dict[str, Any] = response.json()
    return document


def fetch_from_tracker(
    address: str, security: LinkSecurity | None = None, *, timeout_s: float = TIMEOUT_S
) -> dict[str, Any]:
    async def ask() -> NodeTable:
        async with TrackerClient(address, timeout_s=timeout_s, security=security) as client:
            return await client.list_nodes()

    try:
        table = asyncio.run(ask())
    except Unavailable as error:
        if isinstance(error, NoRoute | Unreachable):
            raise
        # gRPC says UNAVAILABLE for a tracker that is not there; no worker was lost.
        raise Unreachable(f"the tracker cannot be reached: {error.message}") from error
    return status_document(
        StatusInputs(
            model=", ".join(sorted({c.model for c in coverage(table.nodes)})) or "(none)",
            table=table,
            tracker_error="",
            lost=(),
            health=tracker_health(table),
            requests=(),
            admission={},
            totals={},
            now=0.0,
        )
    )


def tracker_health(table: NodeTable) -> SwarmHealth:
    """The worst verdict over every model the tracker knows (a tracker serves them all)."""
    verdicts = [judge_health(model, table) for model in sorted({c.model for c in coverage(table.nodes)})]
    if not verdicts:
        return SwarmHealth("no_route", "no certified node is registered")
    return max(verdicts, key=lambda verdict: SEVERITY[verdict.status])


def exit_status(document: Mapping[str, Any]) -> int:
    """0 while a complete route exists (ok or degraded), 1 when none does."""
    return 1 if document["health"]["status"] == "no_route" else 0


def _size(n: float) -> str:
    if not n:
        return "-"
    for unit in ("B", "K", "M", "G"):
        if n < 1024:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}T"


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def _coverage_lines(document: Mapping[str, Any]) -> list[str]:
    lines = []
    for entry in document["coverage"]:
        bar = "".join("-" if count == 0 else str(min(count, 9)) for count in entry["counts"])
        gaps = ", ".join(f"{a}:{b}" for a, b in entry["gaps"])
        lines.append(
            f"coverage {entry['model']} ({entry['n_layers']} layers) [{bar}] "
            + ("complete" if entry["complete"] else f"gaps {gaps}")
        )
    return lines or ["coverage: no certified node serves any model"]


def _node_rows(nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    header = ["NODE", "REACHABILITY", "LAYERS", "HEALTH", "HEARTBEAT", "SESSIONS", "QUEUE", "KV", "MEMORY"]
    header += ["DEVICE", "PREFILL/s", "DECODE/s", "PREFIX"]
    rows = [header]
    for node in nodes:
        start, stop = node["layers"]
        rows.append(
            [
                node["address"],
                _reachability(node),
                f"{start}:{stop}/{node['n_layers']}",
                node["health"],
                "gone" if node["health"] == "lost" else f"{node['seconds_since_heartbeat']:.1f}s",
                f"{node['active_sessions']}/{node['max_sessions']}",
                str(node["queue_depth"]),
                f"{100 * node['kv_used_fraction']:.0f}%",
                f"{_size(node['memory_used_bytes'])}/{_size(node['memory_budget_bytes'])}",
                _device(node),
                f"{node['prefill_tokens_per_s']:.0f}",
                f"{node['decode_tokens_per_s']:.0f}",
                _prefix(node),
            ]
        )
    return _columns(rows)


def _reachability(node: Mapping[str, Any]) -> str:
    """One word for the column (``public``, ``relay:HOST:PORT``, ``private``); the private
    sentence goes under the table (``_private_lines``)."""
    reachability = node.get("reachability", "public")
    if reachability == "relayed":
        return "relay:" + str(node["reachable"]).removeprefix("relayed via ")
    return str(reachability)


def _private_lines(nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    return [
        f"{node['address']} is {node['reachable']} (not routed)"
        for node in nodes
        if node.get("reachability") == "private"
    ]


def _prefix(node: Mapping[str, Any]) -> str:
    """The prefix store: held of budget, and sessions that reused a prefix of all that looked."""
    if node.get("prefix_budget_bytes") is None:
        return "-"
    looked = node["prefix_hits"] + node["prefix_misses"]
    return f"{_size(node['prefix_bytes'])}/{_size(node['prefix_budget_bytes'])},{node['prefix_hits']}/{looked}hit"


def _device(node: Mapping[str, Any]) -> str:
    """``cpu``, or a GPU's kind and its memory in use of its total (what every process holds)."""
    if node.get("device", "cpu") == "cpu":
        return "cpu"
    return f"{node['device']} {_size(node['device_memory_used'])}/{_size(node['device_memory_total'])}"


def _load_lines(document: Mapping[str, Any]) -> list[str]:
    gateway = document.get("gateway") or {}
    lines = []
    if gateway:
        lines.append(
            f"load: {gateway['in_flight']:.0f} in flight of {gateway['capacity']:.0f}, "
            f"{gateway['queued']:.0f} queued, {gateway['admitted_total']:.0f} admitted, "
            f"{gateway['rejected_total']:.0f} rejected"
        )
    for request in document.get("requests") or []:
        prefill = f"prefill {request['prefill_done_tokens']}/{request['prompt_tokens'] or 0}"
        lines.append(
            f"  {request['request_id']} {request['phase']} {prefill} tokens {request['generated_tokens']} "
            f"{request['tokens_per_second']:.1f} tok/s failovers {request['failovers']}"
        )
    return lines


def render_status(document: Mapping[str, Any], source: str) -> str:
    """The document as lines for a terminal: health, coverage with gaps, nodes, load."""
    health = document["health"]
    tracker = document["tracker"]
    epoch = f", epoch {tracker['epoch']}" if tracker.get("epoch") is not None else ""
    lines = [f"meshnet status of {source}{epoch}", f"{health['status']}: {health['reason']}"]
    if not tracker["reachable"]:
        lines.append(f"tracker unreachable: {tracker['error']}")
    lines += _coverage_lines(document)
    lines += _node_rows(document["nodes"]) if document["nodes"] else ["no nodes registered"]
    lines += _private_lines(document["nodes"])
    lines += _load_lines(document)
    return "\n".join(lines)


def fetch_status(
    tracker: str | None, gateway: str, *, api_key: str | None = None, security: LinkSecurity | None = None
) -> tuple[dict[str, Any], str]:
    """The document and where it came from; the tracker when one is named.

    ``api_key`` goes to the gateway; ``security`` (an admin identity, None for a plaintext
    tracker) to the tracker."""
    try:
        if tracker:
            return fetch_from_tracker(tracker, security), f"tracker {tracker}"
        return fetch_from_gateway(gateway, api_key), f"gateway {gateway}"
    except MeshnetError:
        raise
    except (ValueError, KeyError) as error:
        raise FailedPrecondition(f"the status answer could not be read: {error}") from error
