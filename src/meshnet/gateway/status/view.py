"""The status page's data: one JSON document of nodes, coverage, requests, errors and totals.

``status_document`` is a pure function of what the gateway knows at one instant (the tracker's
node table, the telemetry hub's requests, admission figures), so the page, ``/v1/status`` and
``meshnet status`` show the same facts. ``NodeMemory`` keeps nodes that left the tracker's
table for a while, so an operator sees a killed worker turn ``lost`` rather than vanish.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshnet.core.swarm_status import NodeHealth, NodeStatus, NodeTable, SwarmHealth, coverage, node_health
from meshnet.core.tracking import PrefixFigures
from meshnet.gateway.telemetry_hub import TelemetrySnapshot

PHASES = {
    "accepted": "routed",
    "prefill_started": "prefill",
    "prefill_completed": "prefill done",
    "decode_started": "decode",
    "route_health": "failover",
}
"""The last milestone as an operator reads it; other states are shown as they are."""
LOST_KEPT_SECONDS = 120.0
"""How long a node that left the tracker's table stays on the page as ``lost``."""


@dataclass
class NodeMemory:
    """Nodes seen before, by id, so a vanished one can be shown as lost. One per app."""

    kept_seconds: float = LOST_KEPT_SECONDS
    _seen: dict[str, NodeStatus] = field(default_factory=dict)
    _lost_at: dict[str, float] = field(default_factory=dict)

    def update(self, table: NodeTable, now: float) -> tuple[tuple[NodeStatus, float], ...]:
        """Remember ``table``'s nodes; return the lost ones with the time they were lost."""
        current = {node.node_id for node in table.nodes}
        for node in table.nodes:
            self._seen[node.node_id] = node
            self._lost_at.pop(node.node_id, None)
        for node_id in self._seen.keys() - current:
            self._lost_at.setdefault(node_id, now)
        for node_id, lost_at in list(self._lost_at.items()):
            if now - lost_at > self.kept_seconds:
                del self._lost_at[node_id], self._seen[node_id]
        return tuple((self._seen[node_id], lost_at) for node_id, lost_at in self._lost_at.items())


def node_json(node: NodeStatus, health: NodeHealth, live: Mapping[str, float] | None = None) -> dict[str, Any]:
    """``live``: the node's latest figures measured on served requests (the gateway's history)."""
    record = node.record
    live = live or {}
    capability = record.capability
    return {
        "node_id": node.node_id,
        "address": record.address,
        "reachability": node.reachability,
        "reachable": node.reachability_words,
        "model": record.model,
        "layers": [record.layers.start, record.layers.stop],
        "n_layers": record.n_layers,
        "cpu_count": record.hardware.cpu_count,
        "memory_bytes": record.hardware.memory_bytes,
        "memory_used_bytes": node.load.memory_used_bytes,
        "memory_budget_bytes": node.load.memory_budget_bytes,
        **_prefix_json(node.load.prefix),
        "max_sessions": capability.max_sessions,
        "context_tokens": capability.n_ctx_per_session,
        "device": capability.device,
        "device_name": capability.device_name,
        "device_memory_total": capability.device_memory_total,
        "device_memory_used": capability.device_memory_total - capability.device_memory_free,
        "active_sessions": node.load.active_sessions,
        "queue_depth": node.load.queue_depth,
        "kv_used_fraction": node.load.kv_used_fraction,
        "prefill_tokens_per_s": capability.prefill_tokens_per_s,
        "decode_tokens_per_s": capability.decode_tokens_per_s,
        "live_prefill_tokens_per_s": live.get("prefill_tokens_per_s"),
        "live_decode_tokens_per_s": live.get("decode_tokens_per_s"),
        "seconds_since_heartbeat": round(node.seconds_since_heartbeat, 3),
        "certification": record.certification.digest[:16],
        "health": health,
    }


def request_json(snapshot: TelemetrySnapshot, age_seconds: float) -> dict[str, Any]:
    route = snapshot.route or {}
    hops = route.get("hops") or []
    return {
        "request_id": snapshot.request_id,
        "model": snapshot.model,
        "phase": PHASES.get(snapshot.state, snapshot.state),
        "finished": snapshot.finished,
        "age_seconds": round(age_seconds, 3),
        "prompt_tokens": snapshot.prompt_tokens,
        "prefill_done_tokens": snapshot.prefill_done_tokens,
        "prefill_eta_seconds": snapshot.prefill_eta_seconds,
        "replaying": snapshot.replaying,
        "generated_tokens": snapshot.generated_tokens,
        "tokens_per_second": round(snapshot.tokens_per_second, 3),
        "route": [f"{hop.get('address')} [{hop.get('layers')}]" for hop in hops],
        "failovers": snapshot.failovers,
        "finish_reason": snapshot.finish_reason,
        "error": dict(snapshot.error) if snapshot.error else None,
    }


@dataclass(frozen=True)
class StatusInputs:
    """Everything one status document is made of, gathered at one instant."""

    model: str
    table: NodeTable | None
    tracker_error: str
    lost: tuple[tuple[NodeStatus, float], ...]
    health: SwarmHealth
    requests: Sequence[tuple[TelemetrySnapshot, float]]
    admission: Mapping[str, float]
    totals: Mapping[str, float]
    now: float
    live: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Per node id, its latest prefill/decode tok/s measured on served requests."""


MAX_ERRORS = 20


def status_document(inputs: StatusInputs) -> dict[str, Any]:
    table = inputs.table
    live = table.nodes if table else ()
    interval = table.heartbeat_interval_s if table else 0.0
    nodes = [node_json(node, node_health(node, interval), inputs.live.get(node.node_id)) for node in live]
    nodes += [node_json(node, "lost", inputs.live.get(node.node_id)) for node, _ in inputs.lost]
    requests = [request_json(snapshot, age) for snapshot, age in inputs.requests]
    errors = [
        {"request_id": r["request_id"], "age_seconds": r["age_seconds"], **(r["error"] or {})}
        for r in requests
        if r["error"]
    ][:MAX_ERRORS]
    return {
        "model": inputs.model,
        "health": inputs.health.as_json(),
        "tracker": {
            "reachable": table is not None,
            "error": inputs.tracker_error,
            "epoch": table.epoch if table else None,
            "heartbeat_interval_s": interval,
        },
        "nodes": sorted(nodes, key=lambda n: (n["model"], n["layers"], n["address"])),
        "coverage": [c.as_json() for c in coverage(live)],
        "requests": [r for r in requests if not r["finished"]],
        "recent_requests": [r for r in requests if r["finished"]],
        "errors": errors,
        "gateway": dict(inputs.admission),
        "billing": {key: value for key, value in inputs.totals.items()},
    }


def _prefix_json(figures: PrefixFigures | None) -> dict[str, Any]:
    """The node's prefix store: bytes held of its budget, hits and misses (None: not reported)."""
    if figures is None:
        return {"prefix_bytes": None, "prefix_budget_bytes": None, "prefix_hits": None, "prefix_misses": None}
    return {
        "prefix_bytes": figures.bytes_held,
        "prefix_budget_bytes": figures.budget_bytes,
        "prefix_hits": figures.hits,
        "prefix_misses": figures.misses,
    }
