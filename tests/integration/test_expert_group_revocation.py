"""Expert nodes with ``--tracker``: a revoked member is cut off its group, certificates renew.

A real tracker of one swarm CA and three ``meshnet worker --experts I/3 --tracker ADDR`` processes.
Node 0's certificate lives 45 s; the group decodes bit-identical to whole-model llama.cpp, and
after that certificate has expired a fresh handshake with node 0 still succeeds (it renewed over
the tracker, and stored the new certificate). Then `meshnet swarm revoke` names node 1, whose row
streams carried every token's hidden state: node 0 accepted one from it, node 2 opened one to it.
Within moments (the nodes follow the tracker's revocation watch; they never heartbeat, since
they are not routable nodes) every node reports no peer connected (node 0 ended the stream it accepted,
node 2 cancelled the one it opened), the group's next step fails, nodes 0 and 2 refuse every
later step with UNAUTHENTICATED (they left the group for good), and a new row stream with node
1's certificate is refused as revoked.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from expert_harness import decode_bitwise, on_node, rows_call, step_call
from gguf import GGMLQuantizationType as Quant
from swarm_harness import Swarm

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.errors import MeshnetError
from meshnet.core.layers import LayerRange
from meshnet.core.swarm_options import SecurityOptions
from meshnet.deploy.expert_launch import NodeIdentity, expert_group_specs, expert_node
from meshnet.deploy.up_moe import minted_security
from meshnet.engine.backend import StepInput
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.moe import wire as expert_wire
from meshnet.moe.group_client import ExpertGroupClient
from meshnet.process.launcher import launch_all, meshnet_command, stop_all
from meshnet.security.certificates import DEFAULT_NODE_LIFETIME_S, certificate_expiry, mint_node
from meshnet.security.swarm_dir import load_authority, load_identity, save_identity, swarm_dir
from meshnet.wire.tls import LinkSecurity, hop_server_name

pytestmark = pytest.mark.timeout(300)

SPEC = SyntheticSpec(
    architecture="qwen3moe", n_layers=2, n_expert=16, n_expert_used=4, n_ff_expert=32, weight_type=Quant.Q4_0
)
CONFIG = LlamaConfig(n_threads=1, max_slots=2, n_ctx_per_slot=512, max_batch_tokens=64)
SHORT_S = 45.0
"""Long enough for the group to form on a slow machine (a node needs a valid certificate for that)."""


def _identity(root: Path, lifetimes: dict[str, float]) -> Callable[[str], NodeIdentity]:
    """Worker identities of ``root``'s swarm, node ids ``<name>``; ``lifetimes`` shortens some."""

    def mint(name: str) -> NodeIdentity:
        lifetime = lifetimes.get(name, DEFAULT_NODE_LIFETIME_S)
        node = mint_node(load_authority(root), node_id=name, role="worker", now_unix_s=time.time(), lifetime_s=lifetime)
        folder = swarm_dir(root) / "nodes" / name
        save_identity(folder, node)
        return NodeIdentity(SecurityOptions(identity=folder), name)

    return mint


def _describe(address: str, node_id: str, security: LinkSecurity) -> expert_wire.ExpertNodeInfo:
    """A fresh channel, so a fresh handshake: the node presents the certificate it holds now."""
    query = expert_wire.ExpertNodeQuery()
    return on_node(address, security, lambda stub: stub.DescribeExpertNode(query, timeout=10), hop_server_name(node_id))


def _assert_watched_without_heartbeats(swarm: Swarm, log_dir: Path, names: list[str]) -> None:
    """The nodes learnt the list from the revocation watch, and never heartbeated: they are not
    routable nodes (the tracker logs every heartbeat of a node it has not registered)."""
    tracker_log = (swarm.root / "tracker.log").read_text()
    for name in names:
        assert f"heartbeat from node {name}" not in tracker_log, f"{name} heartbeated"
        assert "following the tracker's revocation list" in (log_dir / f"{name}.log").read_text()


def test_expert_nodes_renew_and_cut_a_revoked_member(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path / "moe.gguf", SPEC)
    swarm = Swarm(root=tmp_path / "data", model=model)
    children = []
    group = whole = None
    try:
        tracker = swarm.start_tracker()
        node = expert_node(swarm.root, model, 3)
        node = replace(node, threads=1, max_sessions=2, n_ctx_per_session=512, expert_timeout=30.0, tracker=tracker)
        identity = _identity(swarm.root, {"expert-3-0": SHORT_S})
        peers, specs = expert_group_specs(node, tmp_path, identity=identity)
        children = launch_all(specs, timeout_s=240)
        driver = minted_security(swarm.root, "driver", "gateway")
        whole = LlamaBackend(
            SliceCache(tmp_path / "ref").shard_files(model, LayerRange(0, SPEC.n_layers), SPEC.n_layers).slice, CONFIG
        )
        group = ExpertGroupClient(peers, step_timeout_s=30, security=driver)
        prompt = np.random.default_rng(5).integers(3, 290, 24).astype(np.int32)
        position = decode_bitwise(whole, group, prompt, 6)

        first = load_identity(swarm_dir(swarm.root) / "nodes" / "expert-3-0").cert_pem
        time.sleep(max(certificate_expiry(first) + 1.0 - time.time(), 0.0))
        assert _describe(peers[0], "expert-3-0", driver).peers_connected == 2  # renewed, presented
        renewed = load_identity(swarm_dir(swarm.root) / "nodes" / "expert-3-0").cert_pem
        assert renewed != first and certificate_expiry(renewed) > time.time() + 3600

        revoke = meshnet_command(swarm.root, "swarm", "revoke", "expert-3-1", "--tracker", tracker)
        done = subprocess.run(revoke, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        names = [f"expert-3-{index}" for index in range(3)]

        def connected() -> list[int]:
            return [_describe(peers[i], names[i], driver).peers_connected for i in range(3)]

        deadline = time.monotonic() + 15
        while any(connected()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert connected() == [0, 0, 0], "a row stream of the revoked node stayed up"
        with pytest.raises(MeshnetError):  # whichever node answers first: lost peers, or left
            group.run([StepInput(0, position, tokens=np.array([7], np.int32))])
        for survivor in (0, 2):  # left for good
            assert step_call(peers[survivor], driver, "ExpertStep") == grpc.StatusCode.UNAUTHENTICATED
        node_1 = LinkSecurity(load_identity(swarm_dir(swarm.root) / "nodes" / "expert-3-1"))
        rows = rows_call(peers[0], node_1, 1, group.nodes[0].model_sha256, opening=False)  # refused as it opens
        assert rows == grpc.StatusCode.UNAUTHENTICATED
        _assert_watched_without_heartbeats(swarm, tmp_path, names)
    finally:
        if group is not None:
            group.close()
        if whole is not None:
            whole.close()
        stop_all(children)
        swarm.close()
