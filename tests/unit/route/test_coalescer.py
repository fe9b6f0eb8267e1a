"""The ring's coalescer, without a transport: rows queued in one loop turn leave as one message.

The oracle is the list of messages the fake writer was handed: which rows, in which order,
grouped how. No timing is asserted; "one engine tick" is modelled as futures settled together,
the way the engine thread settles a decode batch's futures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from meshnet.core.errors import Unavailable
from meshnet.route.coalescer import Coalescer, SeamCount


class Writer:
    def __init__(self, fail: bool = False) -> None:
        self.messages: list[list[str]] = []
        self.fail = fail
        self.seams = SeamCount()

    async def __call__(self, rows: Sequence[str]) -> None:
        if self.fail:
            raise Unavailable("the stream broke")
        self.messages.append(list(rows))
        self.seams.add(len(rows))


async def test_rows_of_one_engine_tick_leave_as_one_message() -> None:
    writer = Writer()
    coalescer = Coalescer[str](writer, max_rows=64)
    loop = asyncio.get_running_loop()
    computed = [loop.create_future() for _ in range(8)]

    async def session(index: int) -> None:
        await computed[index]  # the engine step of this session
        await coalescer.send(f"row{index}")

    sessions = [asyncio.ensure_future(session(i)) for i in range(8)]
    await asyncio.sleep(0)
    for future in computed:  # the engine thread settles the whole batch at once
        future.set_result(None)
    await asyncio.gather(*sessions)
    assert writer.messages == [[f"row{i}" for i in range(8)]]
    assert (writer.seams.messages, writer.seams.rows) == (1, 8)


async def test_a_row_one_await_behind_still_joins_the_message() -> None:
    writer = Writer()
    coalescer = Coalescer[str](writer, max_rows=64)

    async def late() -> None:
        await asyncio.sleep(0)  # one more await than the first sender before its send
        await coalescer.send("late")

    await asyncio.gather(coalescer.send("first"), late())
    assert writer.messages == [["first", "late"]]


async def test_rows_of_later_steps_leave_in_later_messages_in_order() -> None:
    writer = Writer()
    coalescer = Coalescer[str](writer, max_rows=64)
    for step in range(3):
        await asyncio.gather(coalescer.send(f"a{step}"), coalescer.send(f"b{step}"))
    assert writer.messages == [["a0", "b0"], ["a1", "b1"], ["a2", "b2"]]


async def test_more_rows_than_a_message_holds_leave_in_several() -> None:
    writer = Writer()
    coalescer = Coalescer[str](writer, max_rows=3)
    await asyncio.gather(*(coalescer.send(str(i)) for i in range(7)))
    assert writer.messages == [["0", "1", "2"], ["3", "4", "5"], ["6"]]


async def test_a_failed_write_fails_every_row_of_its_message_and_the_next_write_goes_on() -> None:
    writer = Writer(fail=True)
    coalescer = Coalescer[str](writer, max_rows=64)
    results = await asyncio.gather(coalescer.send("a"), coalescer.send("b"), return_exceptions=True)
    assert all(isinstance(result, Unavailable) for result in results)
    writer.fail = False
    await coalescer.send("c")
    assert writer.messages == [["c"]]


async def test_a_sender_that_gives_up_does_not_stop_the_others() -> None:
    writer = Writer()
    coalescer = Coalescer[str](writer, max_rows=64)
    gone = asyncio.ensure_future(coalescer.send("gone"))
    stays = asyncio.ensure_future(coalescer.send("stays"))
    await asyncio.sleep(0)
    gone.cancel()
    await stays
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert writer.messages == [["gone", "stays"]]  # written all the same: nothing waits on it
