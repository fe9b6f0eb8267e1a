"""One shard's figures at one moment: the single value behind GetMetrics, Prometheus and the
tracker heartbeat, so the three can never disagree or drift apart by a misspelt key."""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.core.tracking import NodeLoad, PrefixFigures


@dataclass(frozen=True)
class SnapshotFigures:
    """A shard's KV snapshots (``node.kv_snapshots``)."""

    taken: int = 0
    restored: int = 0
    refused: int = 0
    copies_sent: int = 0
    copies_kept: int = 0
    disk_bytes: int = 0
    disk_budget_bytes: int = 0
    disk_evictions: int = 0
    has_peer: bool = False
    """Whether a peer of this recipe and range is known to copy snapshots to."""

    def values(self) -> dict[str, float]:
        return {
            "snapshots_taken_total": float(self.taken),
            "snapshots_restored_total": float(self.restored),
            "snapshots_refused_total": float(self.refused),
            "snapshot_copies_sent_total": float(self.copies_sent),
            "snapshot_copies_kept_total": float(self.copies_kept),
            "snapshot_disk_bytes": float(self.disk_bytes),
            "snapshot_disk_budget_bytes": float(self.disk_budget_bytes),
            "snapshot_disk_evictions_total": float(self.disk_evictions),
            "snapshot_peer": float(self.has_peer),
        }


@dataclass(frozen=True)
class ShardMetrics:
    active_sessions: int
    free_sessions: int
    max_sessions: int
    queue_depth: int
    """Engine steps waiting to run (queued, not yet in a batch)."""
    decode_steps: int
    decode_batches: int
    """Engine calls that ran at least one decode step: steps / batches is the batch occupancy."""
    prefill_tokens: int
    engine_busy_seconds: float
    """Time the engine spent inside the backend, summed since start."""
    rejected_admissions: int
    evictions: int
    expired_steps: int
    """Steps failed because their deadline passed before they could run."""
    draining: bool
    kv_bytes_per_session: int
    weight_bytes: int
    other_bytes: int = 0
    """What the shard holds besides weights and KV (runtime, scratch, a head's table, a tail's LM
    head and vocabulary), by the memory cost model's plan."""
    seam_messages: int = 0
    """Messages this shard sent to another shard: frames forwarded, answers to an upstream shard,
    ring answers to the head. Summed over a route and divided by decode tokens: seam crossings
    per token (N on a ring of N shards, 2(N-1) on the chain); a ring batch is one message."""
    seam_rows: int = 0
    """Session rows those messages carried: one per message on a session's own stream, every
    session of an engine step in one ring batch (``route.ring_batch``)."""
    capability_calls: int = 0
    """GetCapability calls answered: an admin call, which no request should make (routes carry
    each hop's capability)."""
    prefix_hits: int = 0
    """Sessions opened on stored KV of their prompt's prefix (``session.kv_store``)."""
    prefix_misses: int = 0
    prefix_reused_tokens: int = 0
    """Prompt positions restored instead of computed, summed over hits."""
    prefix_bytes: int = 0
    """KV held for reuse now (within ``prefix_budget_bytes``)."""
    prefix_budget_bytes: int = 0
    prefix_entries: int = 0
    prefix_evictions: int = 0
    snapshots: SnapshotFigures = SnapshotFigures()

    @property
    def kv_used_fraction(self) -> float:
        return self.active_sessions / max(self.max_sessions, 1)

    @property
    def batch_occupancy(self) -> float:
        return self.decode_steps / max(self.decode_batches, 1)

    @property
    def kv_bytes_in_use(self) -> int:
        return self.kv_bytes_per_session * self.active_sessions

    def values(self) -> dict[str, float]:
        """The figures by their exposed names (GetMetrics, Prometheus): counters end in ``_total``."""
        return {
            "active_sessions": float(self.active_sessions),
            "free_sessions": float(self.free_sessions),
            "kv_used_fraction": self.kv_used_fraction,
            "queue_depth": float(self.queue_depth),
            "decode_steps_total": float(self.decode_steps),
            "decode_batches_total": float(self.decode_batches),
            "batch_occupancy": self.batch_occupancy,
            "prefill_tokens_total": float(self.prefill_tokens),
            "engine_busy_seconds_total": self.engine_busy_seconds,
            "rejected_admissions_total": float(self.rejected_admissions),
            "evictions_total": float(self.evictions),
            "expired_steps_total": float(self.expired_steps),
            "draining": float(self.draining),
            "kv_bytes_per_session": float(self.kv_bytes_per_session),
            "kv_bytes_in_use": float(self.kv_bytes_in_use),
            "weight_bytes": float(self.weight_bytes),
            "seam_messages_total": float(self.seam_messages),
            "seam_rows_total": float(self.seam_rows),
            "capability_calls_total": float(self.capability_calls),
            "prefix_hits_total": float(self.prefix_hits),
            "prefix_misses_total": float(self.prefix_misses),
            "prefix_reused_tokens_total": float(self.prefix_reused_tokens),
            "prefix_bytes": float(self.prefix_bytes),
            "prefix_budget_bytes": float(self.prefix_budget_bytes),
            "prefix_entries": float(self.prefix_entries),
            "prefix_evictions_total": float(self.prefix_evictions),
            **self.snapshots.values(),
        }

    def node_load(
        self, peer_rtt_ms: tuple[tuple[str, float], ...] = (), prefix_tips: tuple[tuple[bytes, int], ...] = ()
    ) -> NodeLoad:
        """The heartbeat's view of these figures, with a head's ``prefix_tips``."""
        return NodeLoad(
            active_sessions=self.active_sessions,
            free_sessions=self.free_sessions,
            queue_depth=self.queue_depth,
            kv_used_fraction=self.kv_used_fraction,
            peer_rtt_ms=peer_rtt_ms,
            memory_used_bytes=int(self.weight_bytes + self.other_bytes + self.kv_bytes_in_use + self.prefix_bytes),
            memory_budget_bytes=int(
                self.weight_bytes
                + self.other_bytes
                + self.kv_bytes_per_session * self.max_sessions
                + self.prefix_budget_bytes
            ),
            prefix_tips=prefix_tips,
            prefix=PrefixFigures(self.prefix_bytes, self.prefix_budget_bytes, self.prefix_hits, self.prefix_misses),
        )
