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


def check_relay_identity(security: LinkSecurity | None) -> None:
    """Refuse to start under another role's identity: every dialer pins the relay's TLS name,
    which only a relay certificate carries, so each handshake would fail unexplained."""
    from meshnet.core.errors import FailedPrecondition

    if security is not None and security.identity.role != "relay":
        raise FailedPrecondition(
            f"`meshnet relay` needs an identity of role relay, not {security.identity.role}: "
            "join with a token from `meshnet swarm invite --role relay`"
        )


async def run_relay(config: RelayConfig, security: LinkSecurity | None) -> None:
    """Serve until the process ends; the ready line once the port is bound."""
    from meshnet.deploy.launch.ready_lines import RelayServerLine, announce
    from meshnet.membership.tracker_client import TrackerClient
    from meshnet.membership.upkeep import upkeep_tasks
    from meshnet.relay.serve import start_relay

    check_relay_identity(security)
    running = await start_relay(config, security)
    stop = asyncio.Event()
    client = None if config.tracker is None or security is None else TrackerClient(config.tracker, security=security)

    def on_revoked(revoked: frozenset[str]) -> None:
        # Refuse the revoked from their next stream on, and end what they hold open now.
        if security is not None:
            security.revocations.replace(revoked)
        running.servicer.cut(revoked)

    tasks = [] if client is None else upkeep_tasks(client, security, stop, on_revoked=on_revoked)
    announce(RelayServerLine(running.address, None if security is None else security.identity.node_id))
    try:
        await running.server.wait_for_termination()
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if client is not None:
            await client.close()
