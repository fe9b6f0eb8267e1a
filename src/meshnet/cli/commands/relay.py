"""``meshnet relay``: the relay server, its ready line, and what a secured member keeps up.

A relay is a swarm member like a worker: it joins with an invite (of role ``relay``), and with
``--tracker`` it follows the revocation list (a revoked node can neither attach nor dial through
it) and renews its certificate at half life (``membership.upkeep``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshnet.relay.config import RelayConfig
    from meshnet.wire.tls import LinkSecurity


async def run_relay(config: RelayConfig, security: LinkSecurity | None) -> None:
    """Serve until the process ends; the ready line once the port is bound."""
    from meshnet.deploy.launch.ready_lines import RelayServerLine, announce
    from meshnet.membership.tracker_client import TrackerClient
    from meshnet.membership.upkeep import upkeep_tasks
    from meshnet.relay.serve import start_relay

    running = await start_relay(config, security)
    stop = asyncio.Event()
    client = None if config.tracker is None or security is None else TrackerClient(config.tracker, security=security)
    tasks = [] if client is None else upkeep_tasks(client, security, stop)
    announce(RelayServerLine(running.address, None if security is None else security.identity.node_id))
    try:
        await running.server.wait_for_termination()
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if client is not None:
            await client.close()
