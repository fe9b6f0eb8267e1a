"""What following the revocation list costs the tracker: N open watches vs N members polling.

    python scripts/bench_revocation_watch.py --members 50 --window 20

Starts a secured ``meshnet tracker`` process on a fresh swarm, then measures the tracker
process's CPU time over ``--window`` seconds three times: idle; with N members each keeping a
WatchRevocations stream open (``follow_revocations``, as workers, seeders and expert nodes
do); with N members each polling a small unary call (ListModels, as a ListRevocations would be)
every 2 s. Between the last two it revokes a node and reports how long the new list took to
reach every watcher. One machine: the members share its cores with the tracker.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from meshnet.membership.revocations import follow_revocations
from meshnet.membership.tracker_client import TrackerClient
from meshnet.process.launcher import meshnet_command
from meshnet.security.certificates import SwarmAuthority, mint_node
from meshnet.security.identity import Role
from meshnet.security.swarm_dir import init_swarm
from meshnet.wire.tls import LinkSecurity

POLL_S = 2.0


def identity(authority: SwarmAuthority, node_id: str, role: Role = "worker") -> LinkSecurity:
    return LinkSecurity(mint_node(authority, node_id=node_id, role=role, now_unix_s=time.time()))


async def cpu_seconds(process: psutil.Process, window_s: float) -> float:
    before = process.cpu_times()
    await asyncio.sleep(window_s)
    after = process.cpu_times()
    return after.user + after.system - before.user - before.system


async def watching(
    clients: list[TrackerClient], admin: TrackerClient, tracker: psutil.Process, window_s: float
) -> tuple[float, float]:
    """(tracker CPU with every client watching, seconds for a revocation to reach them all)."""
    lists: list[tuple[frozenset[str], float] | None] = [None] * len(clients)

    def keep(index: int) -> Callable[[frozenset[str]], None]:
        return lambda revoked: lists.__setitem__(index, (revoked, time.monotonic()))

    stop = asyncio.Event()
    watches = [asyncio.create_task(follow_revocations(c, keep(i), stop)) for i, c in enumerate(clients)]
    while any(entry is None for entry in lists):
        await asyncio.sleep(0.01)
    cpu = await cpu_seconds(tracker, window_s)
    started = time.monotonic()
    await admin.revoke("w-gone")
    while any(entry is None or "w-gone" not in entry[0] for entry in lists):
        await asyncio.sleep(0.001)
    reached = max(entry[1] for entry in lists if entry is not None) - started
    stop.set()
    await asyncio.gather(*watches)
    return cpu, reached


async def polling(clients: list[TrackerClient], tracker: psutil.Process, window_s: float) -> float:
    stop = asyncio.Event()

    async def poll(index: int) -> None:
        await asyncio.sleep(POLL_S * index / len(clients))  # spread, as independent members would be
        while not stop.is_set():
            await clients[index].list_models()
            await asyncio.sleep(POLL_S)

    pollers = [asyncio.create_task(poll(i)) for i in range(len(clients))]
    await asyncio.sleep(POLL_S + 0.5)
    cpu = await cpu_seconds(tracker, window_s)
    stop.set()
    await asyncio.gather(*pollers)
    return cpu


async def measure(
    address: str, authority: SwarmAuthority, tracker: psutil.Process, members: int, window_s: float
) -> str:
    clients = [TrackerClient(address, security=identity(authority, f"w-{i}")) for i in range(members)]
    admin = TrackerClient(address, security=identity(authority, "a-bench", "admin"))
    try:
        idle = await cpu_seconds(tracker, window_s)
        watch_cpu, reached = await watching(clients, admin, tracker, window_s)
        poll_cpu = await polling(clients, tracker, window_s)
    finally:
        for client in [*clients, admin]:
            await client.close()
    return (
        f"tracker CPU over {window_s:g} s: idle {idle * 1e3:.0f} ms; {members} open watches {watch_cpu * 1e3:.0f} ms; "
        f"{members} members polling every {POLL_S:g} s {poll_cpu * 1e3:.0f} ms. "
        f"A revocation reached all {members} watchers in {reached * 1e3:.1f} ms."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=50)
    parser.add_argument("--window", type=float, default=20.0, help="seconds each CPU figure is measured over")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as raw:
        root = Path(raw)
        authority = init_swarm(root, time.time())
        command = meshnet_command(root, "tracker", "--port", "0", "--join-port", "0", "--db", str(root / "t.db"))
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            address = (child.stdout.readline() if child.stdout else "").split()[-1]
            print(asyncio.run(measure(address, authority, psutil.Process(child.pid), args.members, args.window)))
        finally:
            child.terminate()
            child.wait()


if __name__ == "__main__":
    main()
