"""Where a failover resumes: the newest KV snapshot of the session every hop of the new route holds.

Each hop lists the positions of its snapshots of the session (``HeldSnapshots``); the session
resumes from the largest one all hold (the KV of every layer must be there), as long as at least
one token is left to feed after it (the continuation samples from that step's logits). The plan
names the token link of ``[0, s)`` that every snapshot must be bound to (``core.snapshot``), and
the generated tokens before ``s`` that the tail's sampler takes as chosen. A hop that does not
answer in time holds nothing: a probe never fails a request, it only falls back to replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc

from meshnet.core.events import RouteHop
from meshnet.core.ids import SessionId
from meshnet.core.snapshot import SnapshotPlan, tokens_link
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.kv_wire import held_snapshots_to_proto

PROBE_TIMEOUT_S = 1.0


def resume_point(held: Sequence[Sequence[int]], prompt_tokens: int, generated: int) -> int | None:
    """The largest position every hop holds a snapshot at, with a token left to feed after it."""
    if not held:
        return None
    common = set(held[0]).intersection(*held[1:])
    usable = [s for s in common if 0 < s < prompt_tokens + generated]
    return max(usable, default=None)


def resume_plan(point: int, prompt: Sequence[int], history: Sequence[int]) -> SnapshotPlan:
    """The restore at ``point`` of the session of ``prompt`` that generated ``history``."""
    tokens = [*prompt, *history]
    sampled = tuple(history[: point - len(prompt) + 1]) if point >= len(prompt) else ()
    return SnapshotPlan(point, tokens_link(tokens[:point]), sampled)


async def plan_resume(
    pool: ChannelPool,
    hops: Sequence[RouteHop],
    fingerprint: str,
    session_id: SessionId,
    prompt: Sequence[int],
    history: Sequence[int],
) -> SnapshotPlan | None:
    """The snapshot ``hops`` resume the session from; None: none every hop holds (replay from 0)."""
    held = await asyncio.gather(*(_held(pool, hop, fingerprint, session_id) for hop in hops))
    point = resume_point(held, len(prompt), len(history))
    return None if point is None else resume_plan(point, prompt, history)


async def _held(pool: ChannelPool, hop: RouteHop, fingerprint: str, session_id: SessionId) -> list[int]:
    try:
        reply = await pool.stub(hop.address, hop.node_id).HeldSnapshots(
            held_snapshots_to_proto(fingerprint, session_id), timeout=PROBE_TIMEOUT_S
        )
    except grpc.RpcError:
        return []
    return [int(position) for position in reply.positions]
