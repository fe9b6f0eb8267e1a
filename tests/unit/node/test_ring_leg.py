"""A forwarding shard's ring leg: its watch on the downstream stream ends with an error however
the session ends; a clean close must not leave asyncio an unread task exception to log."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator
from typing import Any

from meshnet.core.errors import Unavailable
from meshnet.node.ring import RingLeg
from meshnet.wire.frames import StepFrame, StepResult


class ClosingLink:
    """A downstream stream that the next shard closes once the head finishes writing."""

    def __init__(self) -> None:
        self._closed = asyncio.Event()
        self.cancelled = False

    async def send(self, frame: StepFrame) -> None:
        raise AssertionError("nothing is sent in this test")

    async def read(self) -> StepResult:
        await self._closed.wait()
        raise Unavailable("shard 127.0.0.1:1 closed the session stream (StatusCode.OK)")

    async def finish_writing(self) -> None:
        self._closed.set()

    def cancel(self) -> None:
        self.cancelled = True


@contextlib.contextmanager
def reported_errors() -> Iterator[list[dict[str, Any]]]:
    """What the running loop's exception handler receives meanwhile (asyncio reports an unread
    task exception there when the task is collected)."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []

    def note(_: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # Only this test's own tasks (a downstream read): garbage an earlier test left behind
        # can be collected here too, and is not this test's to judge.
        future = context.get("future")
        coro = repr(future.get_coro()) if isinstance(future, asyncio.Task) else ""
        if "ClosingLink.read" in coro or "RingLeg._watched" in coro:
            reported.append(context)

    loop.set_exception_handler(note)
    try:
        yield reported
    finally:
        loop.set_exception_handler(None)


async def collected() -> None:
    gc.collect()
    await asyncio.sleep(0)


async def test_a_leg_dropped_after_its_downstream_ended_leaves_no_unread_task_exception() -> None:
    # A session can end here without ``close`` (its stream ended from the other side, the
    # shard tore it down): the watch's error must not be logged as never retrieved.
    with reported_errors() as reported:
        link = ClosingLink()
        leg = RingLeg()
        leg.start(link)
        await link.finish_writing()  # the downstream closes its stream
        await asyncio.sleep(0.01)
        del leg
        await collected()
        assert reported == []


async def test_the_watch_still_says_why_the_downstream_ended() -> None:
    link = ClosingLink()
    leg = RingLeg()
    leg.start(link)
    await link.finish_writing()
    await asyncio.sleep(0.01)
    failure = leg.failure()
    assert isinstance(failure, Unavailable) and "closed the session stream" in failure.message


async def test_without_the_fix_asyncio_would_report_it() -> None:
    # The check above can fail: an unread task exception is reported when the task is collected.
    with reported_errors() as reported:
        link = ClosingLink()
        task = asyncio.ensure_future(link.read())
        await link.finish_writing()
        await asyncio.wait({task})
        del task
        await collected()
        assert [c["message"] for c in reported] == ["Task exception was never retrieved"]


class HungLink(ClosingLink):
    """A downstream stream whose next shard is hung in a step: it never ends its side."""

    async def finish_writing(self) -> None:
        return None


async def test_a_close_cancelled_during_its_grace_still_cancels_the_downstream_stream() -> None:
    # The upstream gives up on this shard after the same 1 s grace this shard gives the next
    # one; cancelled then, the close must still cancel the link, or a hung next shard keeps the
    # session (and its KV) until it shuts down.
    link = HungLink()
    leg = RingLeg()
    leg.start(link)
    closing = asyncio.ensure_future(leg.close(link))
    await asyncio.sleep(0.05)
    closing.cancel()
    await asyncio.wait({closing})
    assert link.cancelled
    assert leg.watch is not None and leg.watch.cancelled()
