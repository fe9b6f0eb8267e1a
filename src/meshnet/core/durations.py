"""Durations as flags take them: a number of seconds, or a number with s, m, h or d (``7d``).

One parser for every such flag (``swarm invite --expires``, ``tracker --work-retention``), so
"1h" means the same everywhere."""

from __future__ import annotations

import math
import re

from meshnet.core.errors import InvalidArgument

_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd]?)$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text`` (``90``, ``90s``, ``15m``, ``1h``, ``7d``); InvalidArgument otherwise."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise InvalidArgument(f"a duration is a number of seconds, or one with s, m, h or d (e.g. 1h), got {text!r}")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if not math.isfinite(seconds):
        raise InvalidArgument(f"a duration must be finite, got {text!r}")
    return seconds


class Seconds(float):
    """A config field's duration in seconds; its flag also reads ``h``/``d`` suffixes
    (``config_flags.text_parser`` calls ``parse``) and writes back as plain seconds."""

    @classmethod
    def parse(cls, text: str) -> Seconds:
        return cls(parse_duration(text))
