"""One request's choices on the route, read from one queue.

Each choice (``n`` > 1 gives several) is a route session of its own, served by
``RouteGenerator.serve`` in a task of its own with its own seed (``PreparedRequest.
choice_generation``), so the shards batch their decode steps together like any concurrent
sessions. Every choice pushes its items into the request's one queue, tagged with its index;
the SSE writer and the non-streaming collector read that queue through ``ChoiceView``s.
Closing the run cancels the choices still running -- which cancels their route sessions -- and
waits for them, so nothing of the request runs after its admission slots go back.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from meshnet.core.errors import MeshnetError
from meshnet.core.ids import RequestId
from meshnet.gateway.choice_view import ChoiceView, GatewayText, ShownItem
from meshnet.gateway.ports import RouteGenerator, TextCodec
from meshnet.gateway.prepare import PreparedRequest
from meshnet.route.life import Failure, LifeItem


def choice_request_id(request_id: RequestId, index: int) -> RequestId:
    """Choice 0 keeps the request's id (its telemetry key); choice i is ``<id>-i``."""
    return request_id if index == 0 else RequestId(f"{request_id}-{index}")


@dataclass(frozen=True)
class _Ended:
    """A choice's task is over; ``error`` if it broke the contract by raising."""

    error: BaseException | None


class _ChoiceSink:
    """The ``route.life.LifeSink`` of one choice: its items into the request's queue, tagged."""

    __slots__ = ("_index", "_queue")

    def __init__(self, queue: asyncio.Queue[tuple[int, LifeItem | _Ended]], index: int) -> None:
        self._queue = queue
        self._index = index

    def put(self, item: LifeItem) -> None:
        self._queue.put_nowait((self._index, item))


class RequestRun:
    """The running choices of one request and the queue they all push into."""

    def __init__(self, views: Sequence[ChoiceView]) -> None:
        self.views = list(views)
        self._queue: asyncio.Queue[tuple[int, LifeItem | _Ended]] = asyncio.Queue()
        self._ready: tuple[int, LifeItem | _Ended] | None = None
        """An item ``wait`` took off the queue, to be read next by ``take``."""
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, generator: RouteGenerator, prepared: PreparedRequest, codec: TextCodec) -> None:
        for index, view in enumerate(self.views):
            text = GatewayText(codec, prepared.stop_sequences)
            sink = _ChoiceSink(self._queue, index)
            serving = generator.serve(prepared.choice_generation(index), view.request_id, text, sink)
            task = asyncio.create_task(serving, name=f"meshnet-{view.request_id}")
            task.add_done_callback(functools.partial(self._ended, index))
            self._tasks.append(task)

    def _ended(self, index: int, task: asyncio.Task[None]) -> None:
        if not task.cancelled():
            self._queue.put_nowait((index, _Ended(task.exception())))

    @property
    def finished(self) -> bool:
        """Every choice has shown its outcome or failure."""
        return all(view.ended for view in self.views)

    @property
    def empty(self) -> bool:
        return self._ready is None and self._queue.empty()

    async def wait(self, timeout_s: float | None) -> bool:
        """Wait until an item is ready; False when ``timeout_s`` passed without one.

        Only an empty queue is waited on, so a stream that keeps up pays no timer per token.
        """
        if not self.empty:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                self._ready = await self._queue.get()
        except TimeoutError:
            return False
        return True

    def take(self) -> tuple[int, list[ShownItem]]:
        """The next ready item (``empty`` must be False), as its choice shows it."""
        if self._ready is not None:
            (index, item), self._ready = self._ready, None
        else:
            index, item = self._queue.get_nowait()
        view = self.views[index]
        if isinstance(item, _Ended):
            if view.ended:
                return index, []
            error = item.error if isinstance(item.error, Exception) else None
            item = Failure(error or MeshnetError("the route ended without reporting how it finished"))
        return index, view.take(item)

    async def first_items(self) -> list[tuple[int, list[ShownItem]]]:
        """Read until every choice has shown something; a failure among them is raised here,
        before a response has started, so that it becomes an HTTP status."""
        seen: set[int] = set()
        read: list[tuple[int, list[ShownItem]]] = []
        while len(seen) < len(self.views):
            await self.wait(None)
            index, shown = self.take()
            for item in shown:
                if isinstance(item, Failure):
                    raise item.error
            seen.add(index)
            read.append((index, shown))
        return read

    async def close(self, grace_s: float) -> None:
        """Cancel the choices still running and wait for them (bounded, uncancellable); the
        items they pushed meanwhile still reach the telemetry hub."""
        for task in self._tasks:
            task.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(grace_s):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        while not self.empty:
            self.take()
