"""What binds a KV snapshot to a session's tokens, and what a resuming route asks a shard to restore.

A snapshot holds a session's KV of one shard's layers for positions ``[0, n)``. Rows written by
one-token decode steps differ from prefill rows of the same tokens, so a snapshot is worth
something only to a replay of that same session continuing exactly as its lost route did: it is
keyed by the session id (a fresh random id per request, shared only by that request's routes)
and ``n``. The tokens it covers are bound by ``token_chain``, a hash chain over the tokens one at
a time: it continues from any position's link, so the head (the one shard that sees tokens)
carries it on from where a session opened, and the resuming driver, which knows the prompt and
the tokens generated so far, computes the link every snapshot it restores must match.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshnet.core.errors import InvalidArgument

TOKEN_LINK_BYTES = 32
TOKENS_SEED = hashlib.sha256(b"meshnet-snapshot-tokens-v1").digest()
"""The link of the empty token sequence."""
UNBOUND = bytes(TOKEN_LINK_BYTES)
"""The token link of a snapshot taken by a shard after the head: it never sees a token, so its
snapshot is bound to the session and positions only (the head's binding vouches for the tokens)."""
MAX_SAMPLED_TOKENS = 1 << 20


def token_chain(previous: bytes, tokens: Sequence[int] | np.ndarray) -> bytes:
    """The link after ``previous`` once ``tokens`` follow it, one token at a time."""
    link = previous
    for token in np.asarray(tokens, dtype=np.int64).tolist():
        link = hashlib.sha256(link + int(token).to_bytes(4, "little", signed=True)).digest()
    return link


def tokens_link(tokens: Sequence[int] | np.ndarray) -> bytes:
    """The link of a whole token sequence, from position 0."""
    return token_chain(TOKENS_SEED, tokens)


@dataclass(frozen=True)
class SnapshotPlan:
    """An opening frame's restore: every shard imports its snapshot of the session at
    ``position`` (``[0, position)``, tokens linking as ``tokens_link``), and the tail first
    advances its sampler through ``sampled`` (the generated tokens fed before the restored KV
    ends: their penalty counts and grammar state) without sampling."""

    position: int
    tokens_link: bytes
    sampled: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.position < 1:
            raise InvalidArgument(f"a snapshot restore starts past position 0, not at {self.position}")
        if len(self.tokens_link) != TOKEN_LINK_BYTES:
            raise InvalidArgument(f"a snapshot's token link is {TOKEN_LINK_BYTES} bytes, not {len(self.tokens_link)}")
        if len(self.sampled) > MAX_SAMPLED_TOKENS:
            raise InvalidArgument(f"a snapshot restore advancing the sampler by {len(self.sampled)} tokens")
