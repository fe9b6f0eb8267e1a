"""Stop sequences over streamed text: what may be shown now, and whether generation must stop.

Text arrives in pieces, so a stop string can straddle two tokens. The matcher therefore holds
back the longest tail that could still be the start of a stop string and releases it only once
it cannot be; on a match everything from the stop string on is dropped, as OpenAI does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StopScan:
    """Result of feeding text: ``emit`` is safe to show; ``stopped`` ends the generation."""

    emit: str
    stopped: bool


class StopMatcher:
    """Incremental stop-sequence search; owned by one request."""

    def __init__(self, sequences: tuple[str, ...]) -> None:
        self._sequences = tuple(sequence for sequence in sequences if sequence)
        self._held = ""
        self._stopped = False

    def push(self, text: str) -> StopScan:
        if self._stopped:
            return StopScan("", True)
        if not self._sequences:
            return StopScan(text, False)
        buffer = self._held + text
        hits = [index for index in (buffer.find(s) for s in self._sequences) if index >= 0]
        if hits:
            self._stopped = True
            self._held = ""
            return StopScan(buffer[: min(hits)], True)
        keep = _longest_partial_suffix(buffer, self._sequences)
        cut = len(buffer) - keep
        self._held = buffer[cut:]
        return StopScan(buffer[:cut], False)

    def flush(self) -> str:
        """Release held-back text once no more text will come."""
        held, self._held = self._held, ""
        return "" if self._stopped else held


def _longest_partial_suffix(buffer: str, sequences: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``buffer`` that is a proper prefix of a stop sequence."""
    best = 0
    for sequence in sequences:
        for length in range(min(len(sequence) - 1, len(buffer)), best, -1):
            if buffer.endswith(sequence[:length]):
                best = length
                break
    return best
