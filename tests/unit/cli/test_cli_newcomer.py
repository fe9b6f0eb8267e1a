"""Rough edges a newcomer hits first: --data-dir placement, --version, --advertise, a missing model.

Workers here run the fake model (``--fake-layers``): these tests are about flags and addresses,
which do not depend on the engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet import __version__
from meshnet.cli import main as cli
from meshnet.cli.commands.serve import tracker_config
from meshnet.core.addresses import check_advertise_address
from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.node.config import FakeModel, WorkerConfig


@pytest.mark.parametrize(
    "argv",
    [
        ["--data-dir", "/srv/mesh", "tracker"],
        ["tracker", "--data-dir", "/srv/mesh"],
        ["tracker", "--data-dir=/srv/mesh"],
    ],
)
def test_data_dir_is_accepted_before_and_after_the_subcommand(argv: list[str]) -> None:
    args = cli.build_parser().parse_args(argv)
    assert args.data_dir == Path("/srv/mesh")
    assert tracker_config(args).db_path == Path("/srv/mesh/tracker.sqlite3")


def test_data_dir_after_the_subcommand_wins_and_its_absence_keeps_the_default() -> None:
    args = cli.build_parser().parse_args(["--data-dir", "/a", "worker", "--layers", "0:1", "--data-dir", "/b"])
    assert args.data_dir == Path("/b")
    assert cli.build_parser().parse_args(["tracker"]).data_dir == cli.default_data_dir()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"meshnet {__version__}"


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("10.0.0.2", "must be host:port with a port from 1 to 65535"),
        ("10.0.0.2:", "must be host:port"),
        ("10.0.0.2:0", "must be host:port"),
        ("10.0.0.2:65536", "must be host:port"),
        ("10.0.0.2:http", "must be host:port"),
        (":7000", "has no host"),
        ("0.0.0.0:7000", "is a wildcard, not routable"),
        ("[::]:7000", "is a wildcard, not routable"),
    ],
)
def test_advertise_needs_a_routable_host_and_a_real_port(address: str, reason: str) -> None:
    with pytest.raises(InvalidArgument, match=reason):
        check_advertise_address(address, flag="--advertise")
    with pytest.raises(InvalidArgument, match="--advertise"):
        WorkerConfig(None, LayerRange(0, 1), Path("."), advertise=address, fake=FakeModel())


@pytest.mark.parametrize("address", ["10.0.0.2:7000", "node-a.lan:1", "[fe80::1]:65535", "127.0.0.1:50051"])
def test_advertise_accepts_addresses_peers_can_dial(address: str) -> None:
    check_advertise_address(address)
    assert WorkerConfig(None, LayerRange(0, 1), Path("."), advertise=address, fake=FakeModel()).advertise == address


def test_the_worker_refuses_a_wildcard_advertise_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--data-dir", str(tmp_path), "worker", "--layers", "0:2", "--fake-layers", "4"]
    assert cli.main([*argv, "--advertise", "0.0.0.0:7000"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (
        "meshnet worker: error [invalid_argument]: --advertise '0.0.0.0:7000' is a wildcard, not routable: "
        "give the IP or name peers reach"
    )


def test_a_bad_flag_value_is_one_labelled_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["worker", "--layers", "0:2", "--port", "eighty"]) == 2
    assert "meshnet worker: error [invalid_argument]: argument --port: invalid int value" in capsys.readouterr().err


def test_a_missing_default_model_says_how_to_get_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["worker", "--layers", "0:2", "--data-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "meshnet worker: error [failed_precondition]: the default model is not provisioned" in error
    assert "run `meshnet provision`" in error


def test_a_busy_tracker_port_is_labelled_port_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["--data-dir", str(tmp_path), "tracker", "--port", str(port)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"meshnet tracker: error [port_in_use]: the tracker cannot listen on 127.0.0.1:{port}")


def test_status_of_an_unreachable_gateway_is_labelled_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--gateway", "http://127.0.0.1:9"]) == 2
    assert capsys.readouterr().err.startswith("meshnet status: error [unreachable]: the gateway at http://127.0.0.1:9")
