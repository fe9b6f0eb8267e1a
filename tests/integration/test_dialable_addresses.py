"""Invites and registrations carry addresses peers can dial, never a wildcard (``0.0.0.0``).

Real processes: a secured tracker bound to ``0.0.0.0``, a worker bound to ``0.0.0.0`` without
``--advertise`` registering with it over this machine's own non-loopback address, and the
``meshnet swarm invite`` a newcomer runs next. The tracker itself refuses a registration whose
address is a wildcard (typed), whoever sends it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from swarm_harness import Swarm, route_addresses, write_tiny_model
from worker_harness import fake_record

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.membership.tracker_client import TrackerClient
from meshnet.process.launcher import meshnet_command
from meshnet.security.invites import parse_token
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.server import start_tracker

pytestmark = pytest.mark.timeout(120)


def lan_address() -> str:
    """One of this machine's own non-loopback IPv4 addresses (where a LAN peer would reach it)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not ipaddress.ip_address(address.address).is_loopback:
                return str(address.address)
    pytest.skip("this machine has no non-loopback IPv4 address")


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    root = tmp_path_factory.mktemp("wildcard-swarm")
    with Swarm(root, write_tiny_model(root)) as running:
        running.start_tracker(host="0.0.0.0")
        # Everyone dials the tracker at the machine's LAN address, as a second machine would.
        running.tracker_address = f"{lan_address()}:{running.tracker_port}"
        yield running


def test_an_invite_from_a_tracker_on_all_interfaces_names_a_dialable_join_address(swarm: Swarm) -> None:
    done = subprocess.run(
        meshnet_command(swarm.root, "swarm", "invite"), capture_output=True, text=True, timeout=60, check=True
    )
    host, _, port = parse_token(done.stdout.strip()).join_address.rpartition(":")
    assert not ipaddress.ip_address(host.strip("[]")).is_unspecified, done.stdout
    # The join port answers there: a joiner on the route to this machine reaches it.
    with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
        pass


def test_a_worker_on_all_interfaces_registers_the_address_that_routes_to_the_tracker(swarm: Swarm) -> None:
    (worker,) = swarm.start_workers("0:6", host="0.0.0.0")
    host, _, port = worker.address.rpartition(":")
    assert host == lan_address(), worker.address
    swarm.wait_routable(1)
    assert asyncio.run(route_addresses(swarm.tracker_address, swarm.security)) == [worker.address]
    # And peers reach it there.
    with socket.create_connection((host, int(port)), timeout=5):
        pass


def test_the_invite_refuses_a_wildcard_join_address_naming_the_flag(swarm: Swarm) -> None:
    argv = meshnet_command(swarm.root, "swarm", "invite", "--join-address", "0.0.0.0:7071")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--join-address '0.0.0.0:7071' is a wildcard" in done.stderr


async def test_the_tracker_refuses_a_registration_at_a_wildcard(tmp_path: Path) -> None:
    running = await start_tracker(TrackerConfig(port=0, db_path=tmp_path / "t.sqlite3", insecure=True))
    try:
        async with TrackerClient(running.address, timeout_s=5.0) as client:
            for address in ("0.0.0.0:9001", "[::]:9001"):
                with pytest.raises(InvalidArgument, match="wildcard"):
                    await client.register(fake_record(LayerRange(0, 4), address), NodeId("w-1"))
    finally:
        await running.stop(grace_s=0)
