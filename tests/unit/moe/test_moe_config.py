"""What an expert node and a group's front take of the worker's flags (``WorkerConfig``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from meshnet.cli.commands.expert_node import expert_node_config
from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.moe.config import ExpertPeer
from meshnet.moe.ownership import ExpertNumerics, ExpertOwnership
from meshnet.node.assembly import expert_front_config
from meshnet.node.config import WorkerConfig

PEERS = ("w-a@127.0.0.1:7001", "127.0.0.1:7002")


def _worker(**changes: object) -> WorkerConfig:
    base = WorkerConfig(
        model=Path("/models/moe.gguf"),
        layer_choice=LayerRange(0, 4),
        data_dir=Path("/data"),
        experts=ExpertOwnership(1, 2),
        expert_peers=PEERS,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_an_expert_node_reads_its_share_peers_engine_and_exchange_settings() -> None:
    worker = _worker(
        max_sessions=3, prefill_chunk=64, flash_attn=False, expert_timeout=7.5, expert_cache_mb=12.5, port=7002
    )
    node = expert_node_config(worker)
    assert node.ownership == ExpertOwnership(1, 2)
    assert node.peers == (ExpertPeer("127.0.0.1:7001", "w-a"), ExpertPeer("127.0.0.1:7002"))
    assert node.llama == worker.llama_config(3) and node.llama.max_slots == 3
    assert node.certification_llama == replace(node.llama, max_slots=1)
    assert node.numerics == ExpertNumerics(64, False, True)
    assert (node.exchange_timeout_s, node.expert_cache_bytes) == (7.5, 12_500_000)
    assert (node.host, node.port, node.tracker, node.model) == ("127.0.0.1", 7002, None, worker.model)
    assert expert_node_config(_worker()).expert_cache_bytes is None


def test_an_expert_node_refuses_a_peer_list_of_another_size_or_no_share() -> None:
    with pytest.raises(InvalidArgument, match="must list all 2 nodes"):
        expert_node_config(_worker(expert_peers=PEERS[:1]))
    with pytest.raises(InvalidArgument, match="--experts I/N"):
        expert_node_config(_worker(experts=None, expert_peers=()))
    with pytest.raises(InvalidArgument, match="NODE_ID@HOST:PORT"):
        expert_node_config(_worker(expert_peers=("127.0.0.1:7001", "nowhere")))


def test_a_front_reads_its_group_range_and_recipe_settings() -> None:
    worker = _worker(experts=None, expert_peers=(), expert_group=PEERS, prefill_chunk=128, repack=False)
    front = expert_front_config(worker)
    assert (front.nodes, front.layers, front.numerics) == (PEERS, LayerRange(0, 4), ExpertNumerics(128, True, False))
