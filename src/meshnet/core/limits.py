"""Limits every component must agree on, defined once."""

from __future__ import annotations

MAX_FRAME_BYTES = 4 * 1024 * 1024
"""Largest gRPC message on a shard stream: a prefill chunk's hidden state plus its frame header.
Senders cut prefills to fit it and receivers refuse anything larger, so both ends use this value."""
