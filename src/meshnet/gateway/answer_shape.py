"""The shape of an answer other than the chat and text completion objects (``/v1/responses``).

``CompletionService.respond`` admits, runs and cleans up a request the same way whatever the
endpoint; an ``AnswerShape`` only turns what the run produced into the endpoint's JSON object
(the collected choices) or its SSE frames (the stream's entries, ``RequestRun.entries``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from meshnet.gateway.choices import Entry
from meshnet.gateway.responses import Collected


class AnswerShape(Protocol):
    def whole(self, collected: Sequence[Collected]) -> dict[str, Any]: ...

    def stream(self, entries: AsyncIterator[Entry | None]) -> AsyncIterator[bytes]:
        """SSE frames from the entries; None among them: nothing came for a while (keep-alive)."""
        ...
