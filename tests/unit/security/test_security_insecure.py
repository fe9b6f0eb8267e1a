"""``--insecure`` is plaintext for loopback development only: any other bind or peer is refused.

Workers here run the fake model (``--fake-layers``): what is refused is the bind and the peer,
before any engine runs.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from meshnet.cli.main import main
from meshnet.core.addresses import require_loopback
from meshnet.core.errors import FailedPrecondition
from meshnet.security.swarm_dir import local_identity
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.server import start_tracker


def test_loopback_addresses_pass() -> None:
    require_loopback(("127.0.0.1:7070", "127.3.4.5:1", "localhost:8080", "[::1]:9", "127.0.0.1"))


@pytest.mark.parametrize("address", ["0.0.0.0:7070", "10.0.0.2:7000", "example.org:1", "[::]:1"])
def test_anything_else_is_refused(address: str) -> None:
    with pytest.raises(FailedPrecondition, match="loopback development only"):
        require_loopback(("127.0.0.1:1", address))


async def test_an_unsecured_tracker_will_not_bind_off_loopback(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="not loopback"):
        await start_tracker(TrackerConfig(host="0.0.0.0", port=0, db_path=tmp_path / "t.sqlite3"))


def test_an_insecure_worker_on_a_public_bind_exits_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--data-dir", str(tmp_path), "worker", "--fake-layers", "2", "--layers", "0:2", "--host", "0.0.0.0"]
    assert main([*argv, "--insecure"]) == 2
    assert "--insecure is for loopback development only" in capsys.readouterr().err


def test_a_worker_without_identity_or_insecure_exits_with_the_way_to_join(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--data-dir", str(tmp_path), "worker", "--fake-layers", "2", "--layers", "0:2"]) == 2
    assert "--join TOKEN" in capsys.readouterr().err


def test_an_insecure_worker_with_a_relay_off_this_machine_exits_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--data-dir", str(tmp_path), "worker", "--fake-layers", "2", "--layers", "0:2", "--insecure"]
    assert main([*argv, "--tracker", "127.0.0.1:7100", "--relay", "203.0.113.5:7090"]) == 2
    err = capsys.readouterr().err
    assert "--insecure is for loopback development only" in err and "203.0.113.5:7090" in err


def test_a_relay_under_another_roles_identity_exits_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = local_identity(tmp_path, "not-a-relay", "worker", time.time())
    argv = ["--data-dir", str(tmp_path), "relay", "--listen", "127.0.0.1:0", "--identity", str(folder)]
    assert main(argv) == 2
    assert "needs an identity of role relay, not worker" in capsys.readouterr().err
