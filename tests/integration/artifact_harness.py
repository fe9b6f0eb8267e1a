"""Seeder processes and an in-process tracker for the artifact-plane tests, secured like a swarm.

The tracker runs with mTLS over ``folder``'s swarm CA; seeders get worker identities minted
from it (``--identity``, as ``Swarm.identity`` does) and the test fetches with one more.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from meshnet.core.swarm_options import SecurityOptions
from meshnet.deploy.launch.commands import INSECURE, minted_identity, seed_command
from meshnet.deploy.launch.ready_lines import SeedLine
from meshnet.node.artifact_server import SeedConfig
from meshnet.process.launcher import ChildProcess, LaunchSpec, stop_all
from meshnet.security.identity import Role
from meshnet.security.swarm_dir import load_identity, local_identity
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.server import start_tracker
from meshnet.tracker.swarm_service import load_tracker_security
from meshnet.wire.tls import LinkSecurity


@dataclass
class ArtifactSwarm:
    """A secured tracker and the CA (in ``root``) every identity of the test is minted from."""

    root: Path
    address: str
    _identities: dict[tuple[str, Role], LinkSecurity] = field(default_factory=dict)

    def identity(self, name: str = "fetcher", role: Role = "worker") -> LinkSecurity:
        if (name, role) not in self._identities:
            folder = local_identity(self.root, name, role, time.time())
            self._identities[name, role] = LinkSecurity(load_identity(folder))
        return self._identities[name, role]

    @property
    def security(self) -> LinkSecurity:
        """The fetching node's identity (a worker, as a worker started by model id is)."""
        return self.identity()

    def identity_options(self, name: str, role: Role = "worker") -> SecurityOptions:
        """``--identity`` of a certificate minted for ``name``, for a process this test starts."""
        return minted_identity(self.root, name, role)


@asynccontextmanager
async def running_tracker(folder: Path) -> AsyncIterator[ArtifactSwarm]:
    folder.mkdir(parents=True, exist_ok=True)
    security = load_tracker_security(folder, time.time())
    config = TrackerConfig(port=0, join_port=0, db_path=folder / "tracker.sqlite3", heartbeat_interval_s=0.5)
    tracker = await start_tracker(config, security=security)
    try:
        yield ArtifactSwarm(folder, tracker.address)
    finally:
        await tracker.stop(0.5)
        security.book.close()


def seed_argv(folder: Path, swarm: ArtifactSwarm | str, directory: Path, name: str) -> tuple[str, ...]:
    """``meshnet seed`` announcing to ``swarm`` (a plaintext tracker's address: ``--insecure``)."""
    if isinstance(swarm, str):
        return seed_command(SeedConfig(directory, tracker=swarm), folder / name, INSECURE)
    return seed_command(SeedConfig(directory, tracker=swarm.address), folder / name, swarm.identity_options(name))


@contextmanager
def seeders(
    folder: Path, swarm: ArtifactSwarm | str, *directories: Path, timeout_s: float = 30.0
) -> Iterator[list[ChildProcess]]:
    """One ``meshnet seed`` process per directory, each announced to the tracker."""
    children = []
    try:
        for index, directory in enumerate(directories):
            command = seed_argv(folder, swarm, directory, f"seed-{index}")
            children.append(
                ChildProcess(LaunchSpec(f"seed-{index}", command, folder / f"seed-{index}.log", SeedLine.PREFIX))
            )
        deadline = time.monotonic() + timeout_s
        for child in children:
            child.await_ready(deadline)
        yield children
    finally:
        stop_all(children)


async def wait_for_holders(
    tracker: str, model_id: str, count: int, security: LinkSecurity | None, timeout_s: float = 20.0
) -> None:
    """Until ``count`` holders announced ``model_id``'s manifest (announcements are asynchronous)."""
    import asyncio

    from meshnet.membership.tracker_client import TrackerClient

    deadline = time.monotonic() + timeout_s
    async with TrackerClient(tracker, security=security) as client:
        while time.monotonic() < deadline:
            if len((await client.find_holders(model_id)).holders) >= count:
                return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{count} holders of {model_id} never announced themselves")
