"""Keep a holder's artifacts announced to the tracker's directory (workers that fetched their
range, seeders), riding out tracker restarts."""

from __future__ import annotations

import asyncio
import logging

from meshnet.artifact.directory import Advertisement
from meshnet.core.errors import MeshnetError
from meshnet.membership.tracker_client import TrackerClient

logger = logging.getLogger(__name__)

ANNOUNCE_BACKOFF_S = (0.2, 5.0)
"""First and longest wait before announcing again after a failed announcement."""


async def announce_forever(client: TrackerClient, advertisement: Advertisement, stop: asyncio.Event) -> None:
    """Announce ``advertisement`` as often as the tracker asks until ``stop``; failures back off."""
    backoff = ANNOUNCE_BACKOFF_S[0]
    while not stop.is_set():
        try:
            delay = await client.advertise(advertisement)
            backoff = ANNOUNCE_BACKOFF_S[0]
        except MeshnetError as error:
            logger.warning("announcing artifacts to %s failed: %s", client.address, error.message)
            delay, backoff = backoff, min(backoff * 2, ANNOUNCE_BACKOFF_S[1])
        try:
            await asyncio.wait_for(stop.wait(), timeout=delay)
        except TimeoutError:
            continue
