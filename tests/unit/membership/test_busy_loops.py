"""Loops other than the heartbeat that meet a shedding tracker wait its hint, not their own backoff.

The revocation watch here (work records: ``tests/unit/route/test_work_reports.py``); the client is
a scripted stand-in, so the wait the watch chose is read directly, with no clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

from meshnet.core.errors import MeshnetError, TrackerBusy, Unreachable
from meshnet.membership.revocations import RETRY_S, _Watch
from meshnet.membership.tracker_client import TrackerClient


class FailingWatch:
    """A tracker client whose every revocation watch ends at once with ``error``."""

    def __init__(self, error: MeshnetError) -> None:
        self.error = error

    async def watch_revocations(self) -> AsyncIterator[frozenset[str]]:
        raise self.error
        yield frozenset()  # pragma: no cover - makes this an async generator


def watch(error: MeshnetError) -> _Watch:
    return _Watch(cast(TrackerClient, FailingWatch(error)), lambda revoked: None)


async def test_a_shed_watch_reopens_after_the_hint_jittered() -> None:
    shed = watch(TrackerBusy("shedding watches", 10.0))
    for _ in range(3):
        await shed.once()
        assert 5.0 <= shed.retry_s <= 15.0  # the hint's, not 0.2 s doubling


async def test_an_unreachable_tracker_is_watched_again_with_doubling_waits() -> None:
    lost = watch(Unreachable("gone"))
    waits = []
    for _ in range(7):
        await lost.once()
        waits.append(lost.retry_s)
    assert waits == [0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0] and RETRY_S == (0.2, 5.0)
