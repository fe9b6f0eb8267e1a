"""The pure parts of expert parallelism: shares, dummies, steering, and the worker's flags."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshnet.cli import main as cli
from meshnet.core.errors import InvalidArgument
from meshnet.moe.ownership import ExpertOwnership


def test_shares_parse_and_refuse() -> None:
    assert ExpertOwnership.parse("1/4") == ExpertOwnership(1, 4)
    for bad in ("4/4", "-1/2", "1", "a/b", "1/2/3", "0/0"):
        with pytest.raises(InvalidArgument):
            ExpertOwnership.parse(bad)


def test_dummies_are_foreign_and_distinct_per_token() -> None:
    share = ExpertOwnership(1, 4)
    dummies = share.dummy_experts(16, 8)
    assert len(set(dummies.tolist())) == 8 and not share.owned_mask(dummies).any()
    selected = np.array([[1, 5, 2, 3, 4, 6, 7, 8], [9, 13, 0, 10, 11, 12, 14, 15]], np.int32)
    steered = share.steer(selected, dummies)
    mine = share.owned_mask(selected)
    assert np.array_equal(steered[mine], selected[mine])  # local slots keep their experts
    for row, local in zip(steered, mine, strict=True):
        assert len(set(row[~local].tolist())) == int((~local).sum())  # one row per dummy per token
        assert not share.owned_mask(row[~local]).any()
    with pytest.raises(InvalidArgument, match="does not own"):
        ExpertOwnership(0, 2).dummy_experts(8, 5)


def test_worker_needs_layers_or_experts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "none.gguf"
    assert cli.main(["--data-dir", str(tmp_path), "worker", "--model", str(model)]) != 0
    assert "--experts I/N" in capsys.readouterr().err
    argv = ["--data-dir", str(tmp_path), "worker", "--model", str(model), "--experts", "0/2", "--layers", "0:2"]
    assert cli.main(argv) != 0
    assert "drop --layers" in capsys.readouterr().err


def test_expert_cache_flag_needs_an_expert_node_and_a_positive_size(tmp_path: Path) -> None:
    from meshnet.core.layers import LayerRange
    from meshnet.node.config import WorkerConfig

    model = tmp_path / "none.gguf"
    with pytest.raises(InvalidArgument, match="--experts I/N"):
        WorkerConfig(model=model, layer_choice=LayerRange(0, 2), data_dir=tmp_path, expert_cache_mb=8)
    with pytest.raises(InvalidArgument, match="positive"):
        WorkerConfig(
            model=model,
            layer_choice=LayerRange(0, 2),
            data_dir=tmp_path,
            experts=ExpertOwnership(0, 2),
            expert_cache_mb=0,
        )
    cached = WorkerConfig(
        model=model, layer_choice=LayerRange(0, 2), data_dir=tmp_path, experts=ExpertOwnership(0, 2), expert_cache_mb=8
    )
    assert cached.expert_cache_mb == 8


def test_an_expert_node_needs_an_identity_and_insecure_stays_on_loopback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Like a layer worker: no swarm identity and no --insecure is refused, and --insecure is
    refused when the node's peers are off this machine (checked before anything loads)."""
    from gguf import GGMLQuantizationType as Quant

    from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model

    spec = SyntheticSpec(architecture="qwen3moe", n_layers=1, n_expert=4, n_expert_used=2, weight_type=Quant.F32)
    model = write_synthetic_model(tmp_path / "moe.gguf", spec)
    base = ["--data-dir", str(tmp_path), "worker", "--model", str(model), "--experts", "0/2"]
    assert cli.main([*base, "--expert-peers", "127.0.0.1:1,127.0.0.1:2"]) != 0
    assert "no swarm identity" in capsys.readouterr().err
    assert cli.main([*base, "--expert-peers", "127.0.0.1:1,192.0.2.7:2", "--insecure"]) != 0
    assert "192.0.2.7:2 is not loopback" in capsys.readouterr().err


def test_expert_peers_are_addresses_or_node_ids_at_addresses() -> None:
    from meshnet.moe.config import ExpertPeer

    assert ExpertPeer.parse("127.0.0.1:7001") == ExpertPeer("127.0.0.1:7001")
    assert ExpertPeer.parse("w-0a1b@127.0.0.1:7001") == ExpertPeer("127.0.0.1:7001", "w-0a1b")
    assert str(ExpertPeer("127.0.0.1:7001", "w-0a1b")) == "w-0a1b@127.0.0.1:7001"
    for bad in ("", "w-0a1b@", "127.0.0.1", "Bad_Id@127.0.0.1:7001"):
        with pytest.raises(InvalidArgument):
            ExpertPeer.parse(bad)
