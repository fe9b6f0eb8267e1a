"""An asyncio event loop in a thread of its own, for code that must block while gRPC runs on it.

The group driver is a ``Backend``: the engine loop, ``LocalRoute`` and the tests call its
``run`` and wait for the logits. Its grpc.aio channels live on this loop (an aio channel belongs
to the loop it was made on) and each call hands a coroutine over and waits for its result, so
the feature has one gRPC concurrency model without making every caller asynchronous.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from meshnet.core.errors import FailedPrecondition

T = TypeVar("T")


class LoopThread:
    """One event loop running in a daemon thread until ``close``."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._closed = False

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result (or its exception)."""
        if self._closed:
            coroutine.close()
            raise FailedPrecondition("the expert group driver is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def close(self) -> None:
        """Cancel what still runs on the loop, stop it and join its thread (idempotent)."""
        if self._closed:
            return
        self.call(_cancel_the_rest())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _cancel_the_rest() -> None:
    current = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not current]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
