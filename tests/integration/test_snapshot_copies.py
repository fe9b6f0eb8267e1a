"""A peer's snapshot copy (``KeepSnapshot``) on a real worker process: kept only when whole and
of the receiver's own recipe and layer range, within its own snapshot disk; refused otherwise,
with the typed error, before anything is stored. A worker that takes no snapshots keeps none.

Fake-engine workers on plaintext loopback (these tests send hand-made copies; who may send one,
workers only, is the policy's: tests/unit/security/test_security_policy.py).
"""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from worker_harness import RunningWorker, WorkerCluster, fake_specs

from meshnet.core.errors import MeshnetError, ResourceExhausted, SnapshotRefused
from meshnet.core.ids import SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.snapshot import UNBOUND
from meshnet.route.shard_stream import ChannelPool
from meshnet.session.snapshots import pack
from meshnet.wire import services
from meshnet.wire.kv_wire import held_snapshots_to_proto
from meshnet.wire.status import error_from_rpc

pytestmark = pytest.mark.timeout(120)

DISK_MB = 1
SESSION = SessionId("s-copied")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningWorker]]:
    settings = {"prefill_chunk": 4, "snapshot_every": 8, "snapshot_disk_mb": DISK_MB}
    with WorkerCluster(tmp_path_factory.mktemp("workers")) as cluster:
        snapshotting = fake_specs([(2, 4)], settings=settings, drain_grace=0)
        plain = fake_specs([(2, 4)], drain_grace=0)
        yield cluster.start(*snapshotting, *plain)


async def _send(worker: RunningWorker, data: bytes) -> tuple[bool | MeshnetError, list[int]]:
    async def pieces() -> AsyncIterator[services.SnapshotPiece]:
        for start in range(0, len(data), 1 << 16):
            yield services.SnapshotPiece(data=data[start : start + (1 << 16)])

    pool = ChannelPool(16 << 20)
    stub = pool.stub(worker.address)
    try:
        try:
            outcome: bool | MeshnetError = (await stub.KeepSnapshot(pieces(), timeout=10)).kept
        except grpc.RpcError as error:
            outcome = error_from_rpc(error)
        held = await stub.HeldSnapshots(held_snapshots_to_proto(worker.fingerprint, SESSION), timeout=5)
        return outcome, list(held.positions)
    finally:
        await pool.close()


def _copy(worker: RunningWorker, positions: int, **changes: object) -> bytes:
    fields: dict[str, object] = {"fingerprint": worker.fingerprint, "layers": worker.layers, "session_id": SESSION}
    fields.update(changes)
    return pack(positions=positions, tokens=UNBOUND, blob=b"kv" * 1000, **fields)  # type: ignore[arg-type]


def test_a_whole_copy_of_its_own_recipe_and_range_is_kept_privately(workers: list[RunningWorker]) -> None:
    receiver = workers[0]
    assert asyncio.run(_send(receiver, _copy(receiver, 8))) == (True, [8])
    (path,) = receiver.log_path.with_suffix("").glob("snapshots/*/*.kvsnap")  # its data dir's
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "kind",
    ["foreign_recipe", "wrong_range", "corrupt", "truncated"],
)
def test_a_copy_not_of_its_own_recipe_and_range_or_not_whole_is_refused(
    workers: list[RunningWorker], kind: str
) -> None:
    receiver = workers[0]
    data = {
        "foreign_recipe": _copy(receiver, 16, fingerprint="another-recipe"),
        "wrong_range": _copy(receiver, 16, layers=LayerRange(0, 2)),
        "corrupt": _copy(receiver, 16)[:-1] + b"X",
        "truncated": _copy(receiver, 16)[:-10],
    }[kind]
    outcome, held = asyncio.run(_send(receiver, data))
    assert isinstance(outcome, SnapshotRefused), outcome
    assert 16 not in held, "a refused copy was stored"


def test_a_copy_past_the_disk_budget_is_refused_while_it_arrives(workers: list[RunningWorker]) -> None:
    receiver = workers[0]
    huge = pack(receiver.fingerprint, receiver.layers, SESSION, 24, UNBOUND, bytes(DISK_MB * 2**20 + 1))
    outcome, held = asyncio.run(_send(receiver, huge))
    assert isinstance(outcome, ResourceExhausted), outcome
    assert 24 not in held


def test_a_worker_that_takes_no_snapshots_keeps_no_copies(workers: list[RunningWorker]) -> None:
    plain = workers[1]
    assert asyncio.run(_send(plain, _copy(plain, 8))) == (False, [])
