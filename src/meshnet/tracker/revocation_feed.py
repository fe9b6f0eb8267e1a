"""The revocation list as the tracker publishes it: WatchRevocations streams follow this feed.

The list itself is the tracker's ``LinkSecurity.revocations`` (what its own port refuses); a
revocation (the Swarm service's Revoke) calls ``changed`` once it replaced the list, and every
open watch then sends the new list. ``close`` ends every watch, so a stopping tracker is not
held for its whole shutdown grace by streams that never end by themselves. Used from the
tracker's event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from meshnet.security.policy import Revocations


class RevocationFeed:
    def __init__(self, revocations: Revocations | None) -> None:
        self._revocations = revocations
        """None on a plaintext tracker: nothing is ever revoked there."""
        self._changed: asyncio.Event | None = None
        self._closed = False

    def current(self) -> frozenset[str]:
        return frozenset() if self._revocations is None else self._revocations.current()

    def changed(self) -> None:
        """Wake every watch: the list may differ from what each sent last."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def close(self) -> None:
        self._closed = True
        self.changed()

    async def updates(self) -> AsyncIterator[frozenset[str]]:
        """The list now, then the list after every change, until ``close``."""
        sent: frozenset[str] | None = None
        while not self._closed:
            revoked = self.current()
            if revoked != sent:
                sent = revoked
                yield revoked
                continue  # it may have changed while the caller sent it
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()
