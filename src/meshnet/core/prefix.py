"""Which KV a shard may reuse for a prompt: the hash chain of its chunk-aligned prefixes.

A shard keeps KV of finished and live sessions' prompts (``session.kv_store``) and restores it
into a new session whose prompt begins the same way. Reuse is exact only where the rows computed
afterwards see the kernels a cold run would, so it stops at an absolute prefill-chunk boundary:
a cold run cuts prompts at absolute multiples of the chunk (``engine.backend.chunk_bounds``), so
KV of an aligned prefix is what any cold run of a prompt that starts with it computes. Rows
written by one-token decode steps take other kernel paths (measured: logits moved by 0.34 on
SmolLM2 Q4_1), so a prompt's KV is keyed by its own aligned chunks only.

The key of a prefix of ``k`` chunks is ``chain[k - 1]``: block ``i``'s hash covers block ``i``'s
token ids and the hash before it, the first one a seed binding recipe, chunk size and namespace.
So equal keys mean equal token prefixes of one recipe, a middle shard (which never sees a
token) can key what it holds by the chain the head vouches for, and a longest match is a walk
down the chain. The namespace keeps apart tenants that must not share a cache (``cache_salt``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from meshnet.core.errors import IntegrityError, InvalidArgument
from meshnet.core.snapshot import TOKEN_LINK_BYTES

BLOCK_HASH_BYTES = 16
"""Each chain link: 128 bits of sha256, so two different prefixes never share a key in practice."""
MAX_CHAIN_BLOCKS = 16384
"""The longest chain a frame or a probe may carry (a million positions at a 64-token chunk)."""
PROMPT_NAMESPACE = "prompt"
MAX_NAMESPACE_CHARS = 128


@dataclass(frozen=True)
class PrefixKey:
    """Where a chain starts: the recipe (its fingerprint), the prefill chunk and a namespace."""

    fingerprint: str
    chunk: int
    namespace: str = PROMPT_NAMESPACE

    def seed(self) -> bytes:
        text = f"meshnet-prefix-v1|{self.fingerprint}|{self.chunk}|{self.namespace}"
        return hashlib.sha256(text.encode()).digest()[:BLOCK_HASH_BYTES]


def prompt_namespace(cache_salt: str = "") -> str:
    """The namespace of prompt KV; a non-empty ``cache_salt`` gives a tenant a cache of its own
    (its prompts' KV is then never restored for anyone who does not send the same salt)."""
    if not cache_salt:
        return PROMPT_NAMESPACE
    return f"{PROMPT_NAMESPACE}|salt:{hashlib.sha256(cache_salt.encode()).hexdigest()}"


def next_link(previous: bytes, block: np.ndarray) -> bytes:
    """The chain link after ``previous`` for one chunk of token ids."""
    data = np.ascontiguousarray(block, dtype="<i4").tobytes()
    return hashlib.sha256(previous + data).digest()[:BLOCK_HASH_BYTES]


def prefix_chain(key: PrefixKey, tokens: Sequence[int] | np.ndarray, *, limit: int | None = None) -> tuple[bytes, ...]:
    """The chain of every whole chunk of ``tokens`` (a trailing partial chunk has no link), at
    most ``limit`` tokens' worth."""
    if key.chunk < 1:
        raise InvalidArgument(f"a prefill chunk of {key.chunk} tokens")
    ids = np.asarray(tokens, dtype=np.int64)
    usable = len(ids) if limit is None else min(len(ids), limit)
    blocks = min(usable // key.chunk, MAX_CHAIN_BLOCKS)
    chain: list[bytes] = []
    link = key.seed()
    for index in range(blocks):
        link = next_link(link, ids[index * key.chunk : (index + 1) * key.chunk])
        chain.append(link)
    return tuple(chain)


def check_chain(chain: Sequence[bytes]) -> tuple[bytes, ...]:
    """``chain`` as received from a peer: refused unless every link is a link."""
    if len(chain) > MAX_CHAIN_BLOCKS:
        raise InvalidArgument(f"a prefix chain of {len(chain)} blocks (at most {MAX_CHAIN_BLOCKS})")
    for link in chain:
        if len(link) != BLOCK_HASH_BYTES:
            raise InvalidArgument(f"a prefix chain link of {len(link)} bytes (each is {BLOCK_HASH_BYTES})")
    return tuple(chain)


class ChainVerifier:
    """The head's check that the chain a session claims is the chain of the tokens it is sent.

    Shards after the head never see a token, so they key the KV they keep by the chain the head
    forwards; a client that sent one prompt's chain with another prompt's tokens would plant
    wrong KV under the first prompt's key. The head feeds every token it runs through here and
    fails the session at the first block whose hash differs, before that block's rows leave it.
    """

    def __init__(self, key: PrefixKey, chain: Sequence[bytes], verified_blocks: int) -> None:
        self._chunk = key.chunk
        self._chain = tuple(chain)
        self._verified = verified_blocks
        self._link = key.seed() if verified_blocks == 0 else self._chain[verified_blocks - 1]
        self._pending: list[np.ndarray] = []
        self._pending_rows = 0

    @property
    def verified_tokens(self) -> int:
        return self._verified * self._chunk

    def feed(self, position: int, tokens: np.ndarray) -> None:
        """Check the blocks ``tokens`` (starting at ``position``) complete; IntegrityError on a
        block that is not the chain's."""
        if self._verified >= len(self._chain):
            return
        expected_at = self._verified * self._chunk + self._pending_rows
        if position != expected_at:
            raise IntegrityError(f"prefix check expected tokens from position {expected_at}, got {position}")
        self._pending.append(np.asarray(tokens))
        self._pending_rows += len(tokens)
        while self._pending_rows >= self._chunk and self._verified < len(self._chain):
            joined = np.concatenate(self._pending)
            block, rest = joined[: self._chunk], joined[self._chunk :]
            link = next_link(self._link, block)
            if link != self._chain[self._verified]:
                raise IntegrityError(
                    f"the prompt's tokens at positions {self._verified * self._chunk}.."
                    f"{(self._verified + 1) * self._chunk} do not hash to the prefix chain the session claims"
                )
            self._link = link
            self._verified += 1
            self._pending = [rest] if len(rest) else []
            self._pending_rows = len(rest)


@dataclass(frozen=True)
class KvPlan:
    """What a session's opening frame tells each shard about reusable KV.

    ``chain`` links the prompt's whole chunks (as the head checks them, ``ChainVerifier``); the
    session starts at position ``reused_blocks * chunk`` with the KV stored for
    ``chain[:reused_blocks]``, and each shard keeps its KV of ``chain[:save_blocks]`` once the
    prefill has written it (0: keeps nothing).
    """

    chain: tuple[bytes, ...]
    reused_blocks: int = 0
    save_blocks: int = 0
    namespace: str = PROMPT_NAMESPACE
    """The chain's namespace (``prompt_namespace``): the head checks the chain from its seed."""
    tokens_link: bytes = b""
    """The token link (``core.snapshot``) of the reused prefix's tokens, which the head carries
    on to bind the session's KV snapshots; empty when nothing is reused."""

    def __post_init__(self) -> None:
        check_chain(self.chain)
        if not self.namespace.startswith(PROMPT_NAMESPACE) or len(self.namespace) > MAX_NAMESPACE_CHARS:
            raise InvalidArgument(f"a KV plan's namespace must be a prompt namespace, got {self.namespace[:40]!r}")
        if not 0 <= self.reused_blocks <= len(self.chain) or not 0 <= self.save_blocks <= len(self.chain):
            raise InvalidArgument(
                f"a KV plan reusing {self.reused_blocks} and keeping {self.save_blocks} of {len(self.chain)} blocks"
            )
        if len(self.tokens_link) not in (0, TOKEN_LINK_BYTES):
            raise InvalidArgument(f"a KV plan's token link of {len(self.tokens_link)} bytes")
        if self.save_blocks and self.save_blocks <= self.reused_blocks:
            raise InvalidArgument("a KV plan keeps a prefix longer than the one it reuses, or none")

    def reusing_nothing(self) -> KvPlan:
        """This plan with every position computed (nothing restored, no reused prefix's link)."""
        return replace(self, reused_blocks=0, tokens_link=b"")

    @property
    def reused_chain(self) -> tuple[bytes, ...]:
        return self.chain[: self.reused_blocks]

    @property
    def saved_chain(self) -> tuple[bytes, ...]:
        return self.chain[: self.save_blocks]
