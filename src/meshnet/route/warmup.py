"""Keep a finished turn's answer as reusable prompt KV, while the user reads it.

A conversation's next prompt is this one, the answer and a new message. The route keeps the
prompt's KV in whole chunks (``core.prefix``), but the answer's rows were written by decode steps,
which are not what a prefill of the same tokens computes, so they cannot be keyed as a prompt:
without more, every turn prefills the last answer again. So once a turn completes, the client
sends the prompt plus the answer through the route once more as a prompt (one token generated,
unbilled): its prefill restores the stored prompt, computes the answer's rows as a cold prefill
would and keeps them, and the next turn prefills only its new message.

The warm-up runs in the user's reading time. A next request that arrives while a warm-up of its
own history is still running waits for it (the rows it computes are the ones that request would
compute itself) rather than racing it for the same route; any other request does not wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from meshnet.core.errors import MeshnetError
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import new_request_id, new_session_id
from meshnet.core.tickets import ticket_seconds
from meshnet.core.tracking import Route
from meshnet.membership.tracker_client import TrackerClient
from meshnet.route.driver import RouteDriver
from meshnet.route.kv_plan import route_chain
from meshnet.route.route_run import RouteSession

log = logging.getLogger(__name__)
WARMUP_TIMEOUT_S = 120.0
MAX_WARMUPS = 4
"""Warm-ups in flight at once; a turn finished beyond them is not warmed (its next turn prefills
the answer, as without warm-ups)."""
WAIT_FOR_WARMUP_S = 30.0


@dataclass(frozen=True)
class _Warming:
    tokens: tuple[int, ...]
    task: asyncio.Task[None]


class TurnWarmer:
    def __init__(self, tracker: TrackerClient, driver: RouteDriver, *, enabled: bool = True) -> None:
        self._tracker = tracker
        self._driver = driver
        self._enabled = enabled
        self._warming: list[_Warming] = []

    def offer(self, request: GenerationRequest, generated: Sequence[int], route: Route) -> None:
        """Warm the KV of ``request``'s prompt and its answer ``generated``, if that adds a whole
        chunk to what the route keeps of the prompt alone."""
        chunk = route.hops[0].capability.prefill_chunk_tokens
        sequence = (*request.prompt_tokens, *generated)
        if not self._enabled or len(self._warming) >= MAX_WARMUPS or not generated:
            return
        if any(hop.capability.prefix_cache_bytes == 0 for hop in route.hops):
            return  # a hop that keeps no prompt KV: the route would compute it all and keep nothing
        if len(sequence) // chunk <= len(request.prompt_tokens) // chunk:
            return  # the answer completes no chunk the prompt had not: nothing new to keep
        warm = GenerationRequest(
            sequence, 1, model=route.fingerprint, timeout_s=WARMUP_TIMEOUT_S, cache_salt=request.cache_salt
        )
        # Its route request names the prefix it extends: the route that holds the prompt.
        task = asyncio.get_running_loop().create_task(self._warm(warm, route_chain(route, warm)))
        entry = _Warming(sequence, task)
        self._warming.append(entry)
        task.add_done_callback(lambda _: self._warming.remove(entry))

    async def settle(self, prompt: Sequence[int]) -> None:
        """Wait (a bounded while) for warm-ups of a history ``prompt`` continues."""
        mine = [w.task for w in self._warming if tuple(prompt[: len(w.tokens)]) == w.tokens]
        if mine:
            await asyncio.wait(mine, timeout=WAIT_FOR_WARMUP_S)

    async def _warm(self, request: GenerationRequest, chain: tuple[bytes, ...]) -> None:
        request_id, session_id = new_request_id(), new_session_id()
        try:
            # By fingerprint: the very recipe that keeps the prompt; unbilled, as nobody asked.
            route = await self._tracker.choose_route(
                request.model,
                session_id=session_id,
                request_id=request_id,
                ticket_seconds=ticket_seconds(request.timeout_s),
                unbilled=True,
                prefix_chain=chain,
            )
            session = RouteSession(request_id, session_id, route.hops, route.fingerprint, route.epoch, route.ticket)
            async with contextlib.aclosing(self._driver.run(session, request)) as events:
                async for _ in events:
                    pass
        except MeshnetError as error:  # a warm-up that fails costs the next turn its answer's rows
            log.info("turn warm-up not kept: %s", error.message)

    async def close(self) -> None:
        tasks = [w.task for w in self._warming]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
