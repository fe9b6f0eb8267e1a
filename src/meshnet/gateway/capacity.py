"""Keeping admission limits at the swarm's size when the configuration leaves them unset.

The swarm's session slots change as workers join and leave, so unset limits are re-read from
the tracker at most every ``capacity_refresh_seconds``, by whichever request finds them stale:
the first ever is awaited (the limits are unknown until then), later ones run in the
background so no request waits on the tracker. An unreachable tracker keeps the last limits:
admission must not fail because of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from meshnet.core.errors import MeshnetError
from meshnet.gateway.admission import Admission
from meshnet.gateway.config import GatewayConfig, admission_limits
from meshnet.gateway.ports import RouteGenerator

log = logging.getLogger(__name__)
ASK_TIMEOUT_S = 2.0


class SwarmCapacity:
    """Resizes one ``Admission`` from the swarm's slots; owned by one event loop."""

    def __init__(
        self, generator: RouteGenerator, admission: Admission, config: GatewayConfig, clock: Callable[[], float]
    ) -> None:
        self._generator = generator
        self._admission = admission
        self._config = config
        self._clock = clock
        self._due = float("-inf")
        self._background: asyncio.Task[None] | None = None
        self.slots: int | None = None
        """The swarm's slots as last reported; None until the tracker has answered."""

    @property
    def derived(self) -> bool:
        return self._config.max_in_flight is None or self._config.max_queue is None

    async def refresh_if_stale(self) -> None:
        if not self.derived or self._clock() < self._due:
            return
        # Set before asking, so a burst of requests asks once; the others use the current limits.
        self._due = self._clock() + self._config.capacity_refresh_seconds
        if self.slots is None:
            await self._refresh()
        elif self._background is None or self._background.done():
            self._background = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):
                slots = await self._generator.session_slots()
        except (MeshnetError, TimeoutError) as error:
            log.warning("could not read the swarm's session slots; keeping the current limits: %s", error)
            return
        if slots is not None and slots != self.slots:
            self.slots = slots
            in_flight, queue = admission_limits(self._config, slots)
            log.info("swarm has %d session slots: admitting %d, queueing %d", slots, in_flight, queue)
            self._admission.resize(in_flight, queue)
