"""Cutting a prefill into step frames that fit the receiving shard's frame budget."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshnet.core.errors import InvalidArgument
from meshnet.wire.frames import FRAME_OVERHEAD_BYTES

_MAX_TOKEN_VARINT_BYTES = 5
"""A non-negative int32 takes at most 5 bytes as a protobuf varint."""


@dataclass(frozen=True, slots=True, eq=False)
class PrefillChunk:
    """One frame's worth of a prefill: a view into the caller's array, no copy."""

    position: int
    payload: np.ndarray
    """Token ids ``[n]`` or hidden ``[n, n_embd]``."""
    final_chunk: bool


def split_prefill(
    payload: np.ndarray, start_position: int, max_frame_bytes: int, *, max_tokens: int | None = None
) -> list[PrefillChunk]:
    """Cut a prefill into chunks whose frames fit ``max_frame_bytes`` (and ``max_tokens``).

    Each frame keeps ``FRAME_OVERHEAD_BYTES`` for header, hops and sampling; the rest is payload.
    """
    if payload.ndim == 1:
        bytes_per_token = _MAX_TOKEN_VARINT_BYTES
    elif payload.ndim == 2:
        bytes_per_token = int(payload.shape[1]) * 4
    else:
        raise InvalidArgument(f"a prefill is token ids [n] or hidden [n, n_embd], got shape {payload.shape}")
    n_total = int(payload.shape[0])
    if n_total == 0:
        raise InvalidArgument("the prefill is empty")
    per_chunk = (max_frame_bytes - FRAME_OVERHEAD_BYTES) // max(bytes_per_token, 1)
    if max_tokens is not None:
        per_chunk = min(per_chunk, max_tokens)
    if per_chunk < 1:
        raise InvalidArgument(
            f"one token ({bytes_per_token} bytes) does not fit a frame of {max_frame_bytes} bytes "
            f"with {FRAME_OVERHEAD_BYTES} bytes kept for the header"
        )
    return [
        PrefillChunk(
            position=start_position + offset,
            payload=payload[offset : offset + per_chunk],
            final_chunk=offset + per_chunk >= n_total,
        )
        for offset in range(0, n_total, per_chunk)
    ]
