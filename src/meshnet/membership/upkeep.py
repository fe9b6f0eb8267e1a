"""What every secured member that serves peers keeps up: its certificate and the revocation list.

Workers, seeders and expert nodes run these beside whatever else they do with the tracker
(workers also heartbeat and announce); a plaintext loopback process has neither to keep up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from meshnet.membership.join import renew_forever
from meshnet.membership.revocations import follow_revocations
from meshnet.membership.tracker_client import TrackerClient
from meshnet.wire.tls import LinkSecurity


def upkeep_tasks(
    client: TrackerClient,
    security: LinkSecurity | None,
    stop: asyncio.Event,
    *,
    on_revoked: Callable[[frozenset[str]], None] | None = None,
) -> list[asyncio.Task[None]]:
    """Renewal at half life and the revocation watch, until ``stop``; none without security.

    ``on_revoked``: what to do with each new list; by default the process refuses those peers
    from its next call on (``security.revocations``)."""
    if security is None:
        return []
    apply = on_revoked or security.revocations.replace
    return [
        asyncio.create_task(renew_forever(client, security, stop), name="renewal"),
        asyncio.create_task(follow_revocations(client, apply, stop), name="revocation-watch"),
    ]
