"""The tail's ring mailbox: answers made before the head's stream opened wait and go first, in
order; later ones are written by the step that made them; failure and the end still reach the
stream's handler."""

from __future__ import annotations

import asyncio

import pytest

from meshnet.core.errors import FailedPrecondition, Unavailable
from meshnet.core.ids import SessionId
from meshnet.node.ring import RingMailbox
from meshnet.wire.frames import StepResult

SESSION = SessionId("s-ring")


def answer(step: int) -> StepResult:
    return StepResult(SESSION, step, step + 1, 7)


class Stream:
    """A RingReturn stream's writes, noting which task made each."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.writers: list[asyncio.Task[object] | None] = []

    async def write(self, result: StepResult) -> None:
        await asyncio.sleep(0)  # a real write suspends
        self.steps.append(result.step)
        self.writers.append(asyncio.current_task())


async def test_answers_before_the_stream_go_first_then_each_step_writes_its_own() -> None:
    mailbox, stream = RingMailbox(), Stream()
    await mailbox.deliver(answer(0))
    await mailbox.deliver(answer(1))
    serving = asyncio.ensure_future(mailbox.serve(stream.write))
    await asyncio.sleep(0.01)
    assert stream.steps == [0, 1]
    await mailbox.deliver(answer(2))  # written here, by the delivering task
    assert stream.steps == [0, 1, 2]
    assert stream.writers[-1] is asyncio.current_task() and stream.writers[0] is serving
    mailbox.close()
    await asyncio.wait_for(serving, 1.0)


async def test_a_failure_after_direct_writes_ends_the_stream_with_its_reason() -> None:
    mailbox, stream = RingMailbox(), Stream()
    serving = asyncio.ensure_future(mailbox.serve(stream.write))
    await asyncio.sleep(0)
    await mailbox.deliver(answer(0))
    mailbox.fail(Unavailable("the upstream stream failed"))
    with pytest.raises(Unavailable, match="upstream"):
        await asyncio.wait_for(serving, 1.0)
    assert stream.steps == [0]


async def test_a_broken_stream_does_not_fail_the_step_that_delivers() -> None:
    mailbox = RingMailbox()

    async def broken(result: StepResult) -> None:
        raise RuntimeError("the call is closed")

    serving = asyncio.ensure_future(mailbox.serve(broken))
    await asyncio.sleep(0)
    await mailbox.deliver(answer(0))  # no exception: the head is gone, the session goes too
    await mailbox.deliver(answer(1))  # back to the queue
    await asyncio.wait_for(serving, 1.0)  # whose reader meets the broken stream and ends


async def test_one_reader_per_session() -> None:
    mailbox, stream = RingMailbox(), Stream()
    serving = asyncio.ensure_future(mailbox.serve(stream.write))
    await asyncio.sleep(0)
    with pytest.raises(FailedPrecondition, match="already being read"):
        await mailbox.serve(stream.write)
    mailbox.close()
    await asyncio.wait_for(serving, 1.0)
