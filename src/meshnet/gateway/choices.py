"""``n`` > 1: independent choices of one request, each its own route session, run at once.

Each choice samples with its own seed (``PreparedRequest.choice_generation``), so the shards
batch their decode steps together like any concurrent sessions. ``interleave`` merges their
item streams as items arrive, tagged with the choice index; a failure of any choice ends them all.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

from meshnet.core.ids import RequestId

T = TypeVar("T")


def choice_request_id(request_id: RequestId, index: int) -> RequestId:
    """Choice 0 keeps the request's id (its telemetry key); choice i is ``<id>-i``."""
    return request_id if index == 0 else RequestId(f"{request_id}-{index}")


async def _next(source: AsyncIterator[T]) -> T:
    return await anext(source)


async def interleave(sources: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """(index, item) from every source as they come; ties in index order; ends when all end."""
    pending = {asyncio.create_task(_next(source)): index for index, source in enumerate(sources)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda finished: pending[finished]):
                index = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                yield index, item
                pending[asyncio.create_task(_next(sources[index]))] = index
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
