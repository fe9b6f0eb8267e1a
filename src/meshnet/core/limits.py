"""Limits every component must agree on, defined once."""

from __future__ import annotations

from meshnet.core.errors import InvalidArgument

MAX_FRAME_BYTES = 4 * 1024 * 1024
"""Largest gRPC message on a shard stream: a prefill chunk's hidden state plus its frame header.
Senders cut prefills to fit it and receivers refuse anything larger, so both ends use this value."""
MAX_CONTEXT = 131_072
"""The most positions one session may hold, whatever a model was trained for (128K: the design's
hard limit; KV is sized per layer range for it)."""
UP_CONTEXT = 8_192
"""What ``meshnet up`` gives a session when ``--context`` is not given: the trained length up to
this. Every worker allocates its sessions' KV for the whole context at start, so a model trained
for 32K (Gemma 3 270M) held 2.5 GB per worker at 8 sessions; a longer context is asked for."""


def up_context(trained: int, asked: int | None = None) -> int:
    """``meshnet up``'s context: ``asked`` (checked as ``served_context`` does), or the trained
    length up to ``UP_CONTEXT``."""
    return served_context(trained, asked if asked is not None else min(trained, MAX_CONTEXT, UP_CONTEXT))


def served_context(trained: int, asked: int | None = None) -> int:
    """Positions per session a swarm serves: ``asked``, or by default the model's trained length,
    never beyond it nor ``MAX_CONTEXT`` (a longer context would attend past what the model saw)."""
    limit = min(trained, MAX_CONTEXT)
    if asked is None:
        return limit
    if not 0 < asked <= limit:
        raise InvalidArgument(
            f"--context {asked}: a session holds 1 to {limit} positions on this model "
            f"(trained for {trained}, at most {MAX_CONTEXT})"
        )
    return asked
