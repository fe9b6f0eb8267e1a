"""The KV snapshot container and the shard's snapshot disk: what is refused before llama.cpp
sees it, and the disk budget, modes and atomic writes."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from meshnet.core.errors import SnapshotRefused
from meshnet.core.ids import SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.snapshot import UNBOUND, token_chain, tokens_link
from meshnet.session.snapshot_disk import SnapshotDisk
from meshnet.session.snapshots import Expected, pack, unpack

S = SessionId("s-1")
R = LayerRange(0, 4)
BLOB = bytes(range(256)) * 8
LINK = tokens_link([1, 2, 3])


def _file(**overrides: object) -> bytes:
    fields: dict[str, object] = {"fingerprint": "fp", "layers": R, "session_id": S, "positions": 3, "tokens": LINK}
    fields.update(overrides)
    return pack(blob=BLOB, **fields)  # type: ignore[arg-type]


def test_round_trip_and_token_chain_continues() -> None:
    header, payload = unpack(_file(), Expected("fp", R, S, 3, LINK))
    assert payload == BLOB and header.positions == 3
    assert token_chain(tokens_link([1]), [2, 3]) == LINK != tokens_link([1, 2, 4])


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (_file()[:-1], Expected("fp", R, S)),  # truncated
        (_file() + b"x", Expected("fp", R, S)),  # oversized
        (_file()[:-1] + b"\x00", Expected("fp", R, S)),  # corrupt payload
        (_file(), Expected("other", R, S)),  # another recipe
        (_file(), Expected("fp", LayerRange(4, 8), S)),  # another range
        (_file(), Expected("fp", R, SessionId("s-2"))),  # another session
        (_file(), Expected("fp", R, S, 4)),  # another length
        (_file(), Expected("fp", R, S, 3, tokens_link([1, 2, 4]))),  # other tokens
        (_file(tokens=UNBOUND), Expected("fp", R, S, 3, LINK)),  # a head needs a binding
        (b"garbage", Expected("fp", R, S)),
        (b"MNKVSNAP\xff\xff\xff\xff", Expected("fp", R, S)),
    ],
    ids=[
        "truncated",
        "oversized",
        "corrupt",
        "recipe",
        "range",
        "session",
        "length",
        "tokens",
        "unbound",
        "garbage",
        "header",
    ],
)
def test_refused(data: bytes, expected: Expected) -> None:
    with pytest.raises(SnapshotRefused):
        unpack(data, expected)


def test_disk_budget_lru_modes_and_restart(tmp_path: Path) -> None:
    directory = tmp_path / "snapshots"
    disk = SnapshotDisk(directory, budget_bytes=2500)
    for positions in (512, 1024, 1536):
        assert disk.put(S, positions, b"x" * 1000)
        assert disk.bytes_held <= 2500
    assert disk.positions(S) == [1536, 1024] and disk.evictions == 1
    assert disk.put(SessionId("s-2"), 512, b"y" * 100) and disk.put(SessionId("s-2"), 1024, b"y" * 100)
    assert disk.put(SessionId("s-2"), 1536, b"y" * 100)  # a session keeps its two newest
    assert disk.positions(SessionId("s-2")) == [1536, 1024]
    assert not disk.put(S, 2048, b"x" * 3000)  # larger than the whole budget
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in directory.iterdir())
    (directory / "junk.kvsnap.partial").write_bytes(b"half")
    again = SnapshotDisk(directory, budget_bytes=1500)  # a restart with a smaller budget
    assert again.positions(S) == [1536] and again.get(S, 1536) == b"x" * 1000
    assert [p.name.endswith(".kvsnap") for p in directory.iterdir()] == [True] * 3  # the partial is gone
    assert again.get(SessionId("s-3"), 1536) is None


def test_a_disk_that_refuses_the_write_costs_the_snapshot_only(tmp_path: Path) -> None:
    directory = tmp_path / "snapshots"
    disk = SnapshotDisk(directory, budget_bytes=2500)
    directory.rmdir()  # gone under the worker (a full or unmounted disk fails the same way)
    assert not disk.put(S, 512, b"x" * 10)
    assert disk.positions(S) == [] and disk.bytes_held == 0
