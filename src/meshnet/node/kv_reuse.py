"""A shard's reuse of stored KV: restore a prompt prefix into a new session, keep the prefix a
session's prefill writes, answer probes. The store itself is ``session.kv_store``; the rule
that makes reuse exact (absolute chunk boundaries, prefill rows only) is ``core.prefix``'s.

A session's opening frame brings its ``KvPlan``. On the head (the shard that sees tokens) the
plan's chain is checked against every token the session is sent (``ChainVerifier``) before the
rows leave: the shards after it key what they keep by that chain, and never see a token.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.core.errors import InvalidArgument, PrefixEvicted
from meshnet.core.ids import SessionId
from meshnet.core.prefix import ChainVerifier, KvPlan, PrefixKey
from meshnet.core.snapshot import SnapshotPlan
from meshnet.engine.backend import StepInput, StepOutput
from meshnet.node.kv_snapshots import KvSnapshots
from meshnet.process.heap import release_free_heap
from meshnet.session.engine_loop import EngineLoop
from meshnet.session.kv_store import KvEntry, KvStore


@dataclass
class _Planned:
    plan: KvPlan
    verifier: ChainVerifier | None
    saved: bool = False


class KvReuse:
    """The KV a shard keeps for reuse, and what each open session planned with it."""

    def __init__(self, store: KvStore, loop: EngineLoop, snapshots: KvSnapshots, *, takes_tokens: bool) -> None:
        self.store = store
        self.snapshots = snapshots
        self._loop = loop
        self._takes_tokens = takes_tokens
        self._chunk = loop.backend.shape.max_batch_tokens
        self._sessions: dict[SessionId, _Planned] = {}

    def held(self, chain: tuple[bytes, ...]) -> int:
        """Blocks of ``chain`` held (the entry is leased to the session about to open with it)."""
        return self.store.held_blocks(chain, pin=True) if self.store.enabled else 0

    async def open(
        self,
        key: SessionId,
        slot: int,
        position: int,
        plan: KvPlan | None,
        fingerprint: str,
        snapshot: SnapshotPlan | None,
    ) -> int:
        """Set the new session's slot up as ``plan`` (or ``snapshot``) says; returns where its KV
        now ends.

        PrefixEvicted when the reused prefix or snapshot is no longer held (the sender opens again
        without); SnapshotRefused when the snapshot fails its checks."""
        if snapshot is not None:
            await self.snapshots.restore(key, slot, snapshot)
            return snapshot.position
        self.snapshots.opened(key, position, b"" if plan is None else plan.tokens_link)
        if plan is None:
            if position != 0:
                raise InvalidArgument(f"a session opened without reused KV starts at 0, not {position}")
            return 0
        tokens = plan.reused_blocks * self._chunk
        if position != tokens:
            raise InvalidArgument(f"a session reusing {tokens} positions must start at {tokens}, not {position}")
        verifier = None
        if self._takes_tokens:
            verifier = ChainVerifier(
                PrefixKey(fingerprint, self._chunk, plan.namespace), plan.chain, plan.reused_blocks
            )
        planned = _Planned(plan, verifier, saved=plan.save_blocks == 0 or not self.store.enabled)
        if tokens:
            entry = self.store.take(plan.reused_chain) if self.store.enabled else None
            if entry is None:
                raise PrefixEvicted(f"this shard no longer holds the KV of the {tokens}-token prefix to reuse")
            blob = entry.blob
            await self._loop.call(lambda backend: backend.import_slot(slot, blob, tokens))
        elif self.store.enabled:
            self.store.miss()
        self._sessions[key] = planned
        return tokens

    async def run(self, key: SessionId, step: StepInput, deadline: float | None, *, prefill: bool) -> StepOutput:
        """Run a session's step, keeping the planned prefix's KV when its prefill writes it.

        Only prefill rows are kept: a decode step's rows take other kernel paths than the aligned
        chunk a cold prefill of the same tokens would run, so decode ends what a session keeps."""
        planned = self._sessions.get(key)
        if planned is None or not prefill:
            if planned is not None:
                planned.saved = True
            return await self.snapshots.run(key, step, deadline)
        if planned.verifier is not None and step.tokens is not None:
            planned.verifier.feed(step.position, step.tokens)  # before the rows leave this shard
        save_at = planned.plan.save_blocks * self._chunk
        if planned.saved or not step.position <= save_at <= step.position + step.n_tokens:
            return await self.snapshots.run(key, step, deadline)
        self.snapshots.advance(key, step)  # one export per step: the prefix's, this time
        output, blob = await self._loop.run_exporting(step, save_at, deadline=deadline)
        planned.saved = True
        if blob is not None:
            self.store.put(KvEntry(planned.plan.saved_chain, save_at, blob))
        # The export's transient copies, and any entry the store just evicted or refused, were
        # MiBs of heap: hand them back, or the store outgrows its share of the budget.
        release_free_heap()
        return output

    def close(self, key: SessionId) -> None:
        self._sessions.pop(key, None)
        self.snapshots.close(key)
