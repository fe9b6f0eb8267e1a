"""S5: a worker started with no address options listens on loopback only.

The workers run the fake backend (``worker_harness``'s default): real processes, gRPC, engine loops
and batching, without llama.cpp. The engine plays no part in where the worker listens.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import psutil
from worker_harness import WorkerCluster, WorkerSpec

from meshnet.core.layers import LayerRange


def test_a_worker_with_no_host_option_listens_on_loopback_only(tmp_path: Path) -> None:
    with WorkerCluster(tmp_path) as cluster:
        (worker,) = cluster.start(WorkerSpec(LayerRange(0, 6)))
        listening = [
            c.laddr
            for c in psutil.Process(worker.process.pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
    assert listening, "the worker should be listening"
    assert all(_is_loopback(address.ip) for address in listening), listening
    assert worker.address.startswith("127.0.0.1:")


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # gRPC binds dual-stack: ::ffff:127.0.0.1
    return (mapped or address).is_loopback
