"""``meshnet publish`` and ``meshnet fetch`` from the command line: a private key made once and
reused, a manifest it signed, and a fetch with no reachable tracker failing with a typed error."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet.artifact.manifest_codec import decode_manifest, verify_manifest_signature
from meshnet.cli.main import main


def test_publish_makes_a_private_key_once_and_signs_with_it(tiny_model: Path, tmp_path: Path) -> None:
    for out in ("first", "second"):
        code = main(
            ["--data-dir", str(tmp_path), "publish", str(tiny_model), "--out", str(tmp_path / out), "--name", "tiny"]
        )
        assert code == 0
    key = tmp_path / "keys" / "publisher.key"
    assert key.stat().st_mode & 0o777 == 0o600
    signers = {
        verify_manifest_signature(decode_manifest((tmp_path / o / "manifest.json").read_bytes()))
        for o in ("first", "second")
    }
    assert len(signers) == 1


def test_fetch_without_a_tracker_is_a_typed_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fetch = ["--data-dir", str(tmp_path), "fetch", "--model-id", "tiny", "--layers", "0:2", "--tracker", "127.0.0.1:1"]
    assert main([*fetch, "--insecure"]) == 2
    # README: a tracker that cannot be reached is `[unreachable]`, never `[worker_lost]`.
    assert "meshnet fetch: error [unreachable]" in capsys.readouterr().err
    # Secured by default: with no identity and no invite it says how to get one.
    assert main(fetch) == 2
    assert "meshnet fetch: error [failed_precondition]: this node has no swarm identity" in capsys.readouterr().err
