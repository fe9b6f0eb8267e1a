"""shard.proto's messages of reusable KV <-> typed values: a prompt prefix's plan (``core.prefix``),
a snapshot restore (``core.snapshot``) and the probes that ask a shard what it holds.

Split from ``shard_wire`` (which encodes the frames that carry the plans); the same rules hold:
decoding never trusts the sender, every chain link and id is checked before use.
"""

from __future__ import annotations

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import SessionId
from meshnet.core.prefix import KvPlan, check_chain
from meshnet.core.snapshot import SnapshotPlan
from meshnet.wire.frames import MAX_ID_CHARS
from meshnet.wire.generated import shard_pb2 as pb


def kv_plan_to_proto(plan: KvPlan) -> pb.KvPlan:
    return pb.KvPlan(
        chain=list(plan.chain),
        reused_blocks=plan.reused_blocks,
        save_blocks=plan.save_blocks,
        namespace=plan.namespace,
        tokens_link=plan.tokens_link,
    )


def snapshot_plan_to_proto(plan: SnapshotPlan) -> pb.SnapshotRestore:
    return pb.SnapshotRestore(position=plan.position, tokens_link=plan.tokens_link, sampled=list(plan.sampled))


def snapshot_plan_from_proto(message: pb.SnapshotRestore) -> SnapshotPlan:
    return SnapshotPlan(message.position, bytes(message.tokens_link), tuple(message.sampled))


def kv_plan_from_proto(message: pb.KvPlan) -> KvPlan:
    """A received KvPlan, its chain checked link by link (``core.prefix.check_chain``)."""
    chain = check_chain(list(message.chain))
    return KvPlan(chain, message.reused_blocks, message.save_blocks, message.namespace, bytes(message.tokens_link))


def held_kv_to_proto(fingerprint: str, chain: tuple[bytes, ...]) -> pb.HeldKvRequest:
    return pb.HeldKvRequest(fingerprint=fingerprint, chain=list(chain))


def held_snapshots_to_proto(fingerprint: str, session_id: SessionId) -> pb.HeldSnapshotsRequest:
    return pb.HeldSnapshotsRequest(fingerprint=fingerprint, session_id=session_id)


def held_snapshots_from_proto(message: pb.HeldSnapshotsRequest) -> tuple[str, SessionId]:
    if not message.session_id or len(message.session_id) > MAX_ID_CHARS:
        raise InvalidArgument("a snapshot probe names one session")
    return message.fingerprint, SessionId(message.session_id)


def held_kv_from_proto(message: pb.HeldKvRequest) -> tuple[str, tuple[bytes, ...]]:
    return message.fingerprint, check_chain(list(message.chain))
