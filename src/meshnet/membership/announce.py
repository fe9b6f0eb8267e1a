"""Keep a holder's artifacts announced to the tracker's directory (workers that fetched their
range, seeders), riding out tracker restarts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

from meshnet.artifact.directory import Advertisement
from meshnet.core.errors import MeshnetError, TrackerBusy
from meshnet.membership.backoff import BusyBackoff
from meshnet.membership.tracker_client import TrackerClient

logger = logging.getLogger(__name__)

ANNOUNCE_BACKOFF_S = (0.2, 5.0)
"""First and longest wait before announcing again after a failed announcement."""
BUSY = BusyBackoff()
UNDIALABLE_RECHECK_S = 1.0
"""How often a holder nobody can dial now looks again whether it can be dialled."""


async def announce_forever(
    client: TrackerClient,
    advertisement: Advertisement,
    stop: asyncio.Event,
    *,
    address: Callable[[], str | None] | None = None,
) -> None:
    """Announce ``advertisement`` as often as the tracker asks until ``stop``; failures back off.

    ``address``: where peers can dial this holder now (a worker behind NAT: its relayed address,
    ``membership.reach``), announced instead of the advertisement's; while it is None (private,
    no relay carrying it) nothing is announced, so peers are not sent to an address nobody can
    dial, and the directory forgets this holder once its last announcement expired."""
    backoff = ANNOUNCE_BACKOFF_S[0]
    while not stop.is_set():
        current = advertisement if address is None else _at(advertisement, address())
        try:
            if current is None:
                delay = UNDIALABLE_RECHECK_S
            else:
                delay = await client.advertise(current)
            backoff = ANNOUNCE_BACKOFF_S[0]
        except TrackerBusy as error:  # shed: the tracker's hint, jittered, not our doubling
            delay = BUSY.wait_s(error.retry_after_s)
            logger.warning("tracker %s busy; announcing again in %.1f s", client.address, delay)
        except MeshnetError as error:
            logger.warning("announcing artifacts to %s failed: %s", client.address, error.message)
            delay, backoff = backoff, min(backoff * 2, ANNOUNCE_BACKOFF_S[1])
        try:
            await asyncio.wait_for(stop.wait(), timeout=delay)
        except TimeoutError:
            continue


def _at(advertisement: Advertisement, address: str | None) -> Advertisement | None:
    return None if address is None else replace(advertisement, address=address)
