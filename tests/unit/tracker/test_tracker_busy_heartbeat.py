"""A busy tracker (registrations shed) still takes each heartbeat's load report: only the probe
list is shed. Dropping the report left ``routed_since_heartbeat`` growing, so every node's free
sessions fell below zero while the tracker was busy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from manual_clock import ManualClock
from tracker_samples import registration

from meshnet.core.ids import NodeId, new_session_id
from meshnet.core.tracking import NodeLoad, RouteQuery
from meshnet.tracker.admission import Admission
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.service import TrackerServicer
from meshnet.tracker.store_runner import StoreRunner
from meshnet.tracker.stores import open_store
from meshnet.wire import tracker_wire as wire

BEHIND_S = 10.0
"""Lag far past every shedding threshold but live calls' (``tracker.admission``)."""
NO_CONTEXT: Any = None
"""A plaintext servicer never reads the call's context (nobody is authenticated)."""


async def test_a_busy_tracker_records_the_load_of_each_heartbeat_and_sheds_only_probes(tmp_path: Path) -> None:
    clock = ManualClock(1000.0)
    registry = NodeRegistry(clock=clock, heartbeat_interval_s=2.0)
    runner = StoreRunner(open_store(TrackerConfig(port=0, db_path=tmp_path / "tracker.sqlite3")))
    servicer = TrackerServicer(registry, runner, lambda: 0.0, admission=Admission(lambda: BEHIND_S))
    try:
        assert servicer.admission.sheds("registration") and servicer.admission.sheds("probe")
        nodes = [registry.register(registration(0, 20, address=f"h:{port}"), NodeId(f"n{port}")) for port in (1, 2)]
        for _ in range(3):  # routes taken between beats count against the head's free sessions
            registry.choose_route(RouteQuery(registry.list_models()[0].fingerprint, new_session_id()))
        assert sum(entry.routed_since_heartbeat for entry in registry.entries()) == 3
        for node in nodes:
            reply = await servicer.Heartbeat(wire.heartbeat_to_proto(node, NodeLoad(free_sessions=2)), NO_CONTEXT)
            status = wire.heartbeat_status_from_proto(reply)
            assert status.known and status.probe == ()
        entries = {entry.node_id: entry for entry in registry.entries()}
        assert sum(entries[node].routed_since_heartbeat for node in nodes) == 0
        assert {node: entries[node].view().free_sessions for node in nodes} == {node: 2 for node in nodes}
    finally:
        runner.close()
