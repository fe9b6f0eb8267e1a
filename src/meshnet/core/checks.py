"""Bounds every value that arrives off the wire is checked against, written once.

Every constructor of a core value that crosses a process boundary validates with these and
raises ``InvalidArgument``; bounds are generous but finite.
"""

from __future__ import annotations

import math

from meshnet.core.errors import InvalidArgument

MAX_TEXT = 256
"""Longest address, model name, quantization or id we accept."""
MAX_SESSIONS = 1_000_000
MAX_LAYERS = 100_000
MAX_POSITIONS = 2**31 - 1
"""llama.cpp positions are int32: no context, chunk or frame holds more tokens than this."""


def check_text(name: str, value: str, *, allow_empty: bool = False) -> None:
    """Raise unless ``value`` is a bounded, printable one-line string."""
    if not isinstance(value, str) or (not value and not allow_empty):
        raise InvalidArgument(f"{name} is empty")
    if len(value) > MAX_TEXT or not value.isprintable():
        raise InvalidArgument(f"{name} must be printable and at most {MAX_TEXT} characters")


def check_count(name: str, value: int, limit: int, *, low: int = 0) -> None:
    if not low <= value <= limit:
        raise InvalidArgument(f"{name} must be in [{low}, {limit}], got {value}")


def check_finite(name: str, value: float, *, low: float = 0.0, high: float = math.inf) -> None:
    if not (math.isfinite(value) and low <= value <= high):
        raise InvalidArgument(f"{name} must be a finite number in [{low}, {high}], got {value}")
