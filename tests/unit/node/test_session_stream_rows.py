"""How a Session stream takes its next frame: ring batch rows, the upstream's frames and the
downstream's end, whichever comes first (``node.session_stream.SessionStream.next_frame``).

The shard is a stand-in with only ``ring_watch`` (all ``next_frame`` asks of it) and the two
calls ``end`` makes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from meshnet.core.errors import Unavailable
from meshnet.core.ids import SessionId
from meshnet.node.session_stream import SessionStream


class _Watched:
    """A shard whose session's downstream ends when the test says so."""

    def __init__(self) -> None:
        self.watch: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def ring_watch(self, key: SessionId) -> asyncio.Future[Any]:
        return self.watch

    def fail_ring(self, key: SessionId, error: Exception, *, epoch: int | None = None) -> None:
        pass

    async def end(self, key: SessionId, reason: str, *, epoch: int | None = None) -> bool:
        return True


async def _upstream(frames: asyncio.Queue[str | None]) -> AsyncIterator[str]:
    while (frame := await frames.get()) is not None:
        yield frame


def _open_stream(shard: _Watched) -> SessionStream[str]:
    stream = SessionStream[str](cast(Any, shard), None)
    stream.session_id = SessionId("s-1")  # as after its opening frame ran
    return stream


async def test_rows_come_in_the_order_offered_and_wake_a_waiting_stream() -> None:
    shard = _Watched()
    stream = _open_stream(shard)
    frames: asyncio.Queue[str | None] = asyncio.Queue()
    upstream = _upstream(frames)
    stream.offer("row-1")
    assert await stream.next_frame(upstream) == "row-1"  # queued: no wait at all
    waiting = asyncio.ensure_future(stream.next_frame(upstream))
    await asyncio.sleep(0)
    assert not waiting.done()
    stream.offer("row-2")
    stream.offer("row-3")
    assert await waiting == "row-2"
    assert await stream.next_frame(upstream) == "row-3"
    await frames.put("frame-1")  # the upstream's own frame, asked for while rows were awaited
    assert await stream.next_frame(upstream) == "frame-1"
    await frames.put(None)
    assert await stream.next_frame(upstream) is None
    assert not cast(Any, shard.watch)._callbacks  # no wake-up callback left behind per step


async def test_the_downstream_ending_ends_a_waiting_stream_with_its_error() -> None:
    shard = _Watched()
    stream = _open_stream(shard)
    frames: asyncio.Queue[str | None] = asyncio.Queue()
    waiting = asyncio.ensure_future(stream.next_frame(_upstream(frames)))
    await asyncio.sleep(0)
    shard.watch.set_exception(Unavailable("the next hop went away"))
    with pytest.raises(Unavailable, match="next hop went away"):
        await waiting
    await stream.end(None)  # cancels the upstream read it still had open


async def test_a_row_offered_after_the_downstream_ended_is_still_taken_first() -> None:
    # Rows are the session's own frames: they go before any news of the stream's end.
    shard = _Watched()
    stream = _open_stream(shard)
    shard.watch.set_exception(Unavailable("gone"))
    stream.offer("row-1")
    frames: asyncio.Queue[str | None] = asyncio.Queue()
    assert await stream.next_frame(_upstream(frames)) == "row-1"
    with pytest.raises(Unavailable):
        await stream.next_frame(_upstream(frames))
    await stream.end(None)
