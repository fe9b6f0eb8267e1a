"""One request's choices on the route, and the one queue their answers come back in.

Each choice (``n`` > 1 gives several) is a route session of its own, served by
``RouteGenerator.serve`` in a task of its own with its own seed (``PreparedRequest.
choice_generation``), so the shards batch their decode steps together like any concurrent
sessions. The sink each choice pushes into shows every item at once through the choice's
``ChoiceView`` (so telemetry is live whatever the client reads) and puts what the response needs
into the request's one queue, tagged with the choice's index: every shown item when the answer
is streamed, only the outcome or failure when it is whole (the text is kept aside until then).
The SSE writer and the collector read that queue. Closing the run cancels the choices still
running -- which cancels their route sessions -- and waits for them, so nothing of the request
runs after its admission slots go back.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Sequence

import anyio

from meshnet.core.errors import MeshnetError
from meshnet.core.ids import RequestId
from meshnet.gateway.choice_view import ChoiceView, GatewayText, ShownItem, TextDelta
from meshnet.gateway.logprob_format import LogprobEntry
from meshnet.gateway.ports import RouteGenerator, TextCodec
from meshnet.gateway.prepare import PreparedRequest
from meshnet.gateway.responses import Collected
from meshnet.route.life import Failure, LifeItem, Outcome

Entry = tuple[int, list[ShownItem]]
"""A choice's index and what one of its items showed."""


def choice_request_id(request_id: RequestId, index: int) -> RequestId:
    """Choice 0 keeps the request's id (its telemetry key); choice i is ``<id>-i``."""
    return request_id if index == 0 else RequestId(f"{request_id}-{index}")


class _ChoiceSink:
    """The ``route.life.LifeSink`` of one choice: shows each item, queues what the response needs."""

    def __init__(self, queue: asyncio.Queue[Entry], index: int, view: ChoiceView, *, streamed: bool) -> None:
        self._queue = queue
        self._index = index
        self._view = view
        self._streamed = streamed
        self._heard = False
        self.parts: list[str] = []
        self.logprobs: list[LogprobEntry] = []

    def put(self, item: LifeItem) -> None:
        shown = self._view.take(item)
        if self._streamed:
            # The first entry goes out even if it shows nothing: the stream's headers wait for it.
            if shown or not self._heard:
                self._heard = True
                self._queue.put_nowait((self._index, shown))
            return
        for each in shown:
            if isinstance(each, TextDelta):
                self.parts.append(each.text)
                self.logprobs.extend(each.logprobs)
            elif isinstance(each, Outcome | Failure):
                self._queue.put_nowait((self._index, [each]))


class RequestRun:
    """The running choices of one request and the queue they all answer in."""

    def __init__(self, views: Sequence[ChoiceView], *, streamed: bool) -> None:
        self.views = list(views)
        self._queue: asyncio.Queue[Entry] = asyncio.Queue()
        self._sinks = [_ChoiceSink(self._queue, i, view, streamed=streamed) for i, view in enumerate(self.views)]
        self._ready: Entry | None = None
        """An entry ``wait`` took off the queue, to be read next by ``take``."""
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, generator: RouteGenerator, prepared: PreparedRequest, codec: TextCodec) -> None:
        for index, (view, sink) in enumerate(zip(self.views, self._sinks, strict=True)):
            text = GatewayText(codec, prepared.stop_sequences)
            serving = generator.serve(prepared.choice_generation(index), view.request_id, text, sink)
            task = asyncio.create_task(serving, name=f"meshnet-{view.request_id}")
            task.add_done_callback(functools.partial(self._ended, index))
            self._tasks.append(task)

    def _ended(self, index: int, task: asyncio.Task[None]) -> None:
        """A choice's task is over: if it never pushed how the request ended (it raised, or broke
        the contract), that is a failure of the request, never a hang."""
        if task.cancelled() or self.views[index].ended:
            return
        error = task.exception()
        bug = error if isinstance(error, Exception) else None
        self._sinks[index].put(Failure(bug or MeshnetError("the route ended without reporting how it finished")))

    @property
    def drained(self) -> bool:
        """Every choice has ended and the reader has taken all it queued."""
        return self.empty and all(view.ended for view in self.views)

    @property
    def empty(self) -> bool:
        return self._ready is None and self._queue.empty()

    async def wait(self, timeout_s: float | None) -> bool:
        """Wait until an entry is ready; False when ``timeout_s`` passed without one.

        Only an empty queue is waited on, so a reader that is behind pays no timer per token.
        """
        if not self.empty:
            return True
        if timeout_s is None:
            self._ready = await self._queue.get()
            return True
        try:
            async with asyncio.timeout(timeout_s):
                self._ready = await self._queue.get()
        except TimeoutError:
            return False
        return True

    def take(self) -> Entry:
        """The next ready entry (``empty`` must be False)."""
        if self._ready is not None:
            entry, self._ready = self._ready, None
            return entry
        return self._queue.get_nowait()

    async def first_entries(self) -> list[Entry]:
        """Read until every choice has pushed something; a failure among them is raised here,
        before a response has started, so that it becomes an HTTP status."""
        seen: set[int] = set()
        read: list[Entry] = []
        while len(seen) < len(self.views):
            await self.wait(None)
            index, shown = self.take()
            for item in shown:
                if isinstance(item, Failure):
                    raise item.error
            seen.add(index)
            read.append((index, shown))
        return read

    async def entries(
        self, preamble: list[ShownItem], firsts: list[Entry], keepalive_s: float
    ) -> AsyncGenerator[Entry | None, None]:
        """A stream's entries after ``first_entries``: the queue wait's events (``preamble``, as
        choice 0's), each choice's first items, then every item as it comes; None whenever none
        came for ``keepalive_s`` (a long prefill or a failover replay), so a keep-alive goes out."""
        yield 0, preamble
        for entry in firsts:
            yield entry
        while not self.drained:
            if self.empty and not await self.wait(keepalive_s):
                yield None
                continue
            yield self.take()

    async def collect(self, logprobs: bool) -> list[Collected]:
        """Every choice of a whole answer to its end; the first failure is raised (the caller's
        ``close`` then ends the others)."""
        outcomes: dict[int, Outcome] = {}
        while len(outcomes) < len(self.views):
            await self.wait(None)
            index, (end,) = self.take()
            if isinstance(end, Failure):
                raise end.error
            if isinstance(end, Outcome):
                outcomes[index] = end
        return [
            Collected("".join(sink.parts), outcomes[i], tuple(sink.logprobs) if logprobs else None)
            for i, sink in enumerate(self._sinks)
        ]

    async def close(self, grace_s: float) -> None:
        """Cancel the choices still running and wait for them, bounded and uncancellable."""
        for task in self._tasks:
            task.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(grace_s):
            await asyncio.gather(*self._tasks, return_exceptions=True)
