"""An expert-parallel group under mutual TLS from one swarm CA, with real handshakes.

Two ``meshnet worker --experts I/2 --identity DIR`` processes (worker certificates of one swarm)
serve a synthetic qwen3moe (64 experts, top-8, repacked Q4_0); a driver holding a gateway
certificate steps them and every logit equals whole-model llama.cpp bit for bit. Between its
steps, intruders call the nodes, each refused the way the swarm refuses elsewhere:
- a client with a certificate of another CA, or none (plaintext): the handshake fails
  (UNAVAILABLE) for ExchangeRows, ExpertStep and DescribeExpertNode alike;
- swarm certificates of the wrong role: a gateway or an admin opening ExchangeRows (slot rows
  are for the group's nodes only), a tracker stepping the group: PERMISSION_DENIED;
- a worker certificate of the swarm that is not the node listed for the index it claims
  (``NODE_ID@HOST:PORT``): PERMISSION_DENIED; node 1's own certificate passes and is then
  refused by the group itself (its stream exists already), which shows the checks, not the
  stream, refused the others;
- a driver dials only workers: a server presenting a gateway certificate fails its handshake.
The driver's decode continues bit-identical after every refusal; then both nodes exit 0 on SIGTERM.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import grpc.aio
import numpy as np
import pytest
from expert_harness import call_status, decode_bitwise, launch_secure_group, rows_call, step_call
from gguf import GGMLQuantizationType as Quant

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.errors import Unavailable
from meshnet.core.layers import LayerRange
from meshnet.deploy.up_moe import minted_security
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.moe import wire as expert_wire
from meshnet.moe.group_client import ExpertGroupClient
from meshnet.moe.loop_thread import LoopThread
from meshnet.process.launcher import stop_all
from meshnet.security.swarm_dir import load_identity, swarm_dir
from meshnet.wire.tls import LinkSecurity, bind, hop_server_name

pytestmark = pytest.mark.timeout(300)

SPEC = SyntheticSpec(
    architecture="qwen3moe", n_layers=2, n_expert=64, n_expert_used=8, n_ff_expert=32, weight_type=Quant.Q4_0
)
CONFIG = LlamaConfig(n_threads=1, max_slots=2, n_ctx_per_slot=512, max_batch_tokens=64)
QUERY = expert_wire.ExpertNodeQuery()


def _intrusions(peers: list[str], data: Path, foreign: Path, model_sha256: str) -> dict[str, grpc.StatusCode]:
    """What each intruder's call on node 0 ends with (node 0 accepts node 1's stream)."""
    rogue = minted_security(foreign, "rogue", "worker")  # a worker certificate, of another swarm's CA
    gateway, admin = (minted_security(data, f"intruder-{role}", role) for role in ("gateway", "admin"))
    tracker, worker = (minted_security(data, f"intruder-{role}", role) for role in ("tracker", "worker"))
    node_1 = LinkSecurity(load_identity(swarm_dir(data) / "nodes" / "expert-2-1"))
    node = peers[0]
    return {
        "foreign rows": rows_call(node, rogue, 1, model_sha256),
        "foreign step": step_call(node, rogue, "ExpertStep"),
        "foreign describe": step_call(node, rogue, "DescribeExpertNode"),
        "plaintext rows": rows_call(node, None, 1, model_sha256),
        "plaintext step": step_call(node, None, "ExpertStep"),
        # Refused by role as the stream opens, before any frame (see rows_call).
        "gateway rows": rows_call(node, gateway, 1, model_sha256, opening=False),
        "admin rows": rows_call(node, admin, 1, model_sha256, opening=False),
        "tracker step": step_call(node, tracker, "ExpertStep"),
        "impostor worker rows": rows_call(node, worker, 1, model_sha256),
        "node 1 rows": rows_call(node, node_1, 1, model_sha256),
        "admin step": step_call(node, admin, "ExpertStep"),
        "tracker describe": step_call(node, tracker, "DescribeExpertNode"),
    }


EXPECTED = {
    "foreign rows": grpc.StatusCode.UNAVAILABLE,
    "foreign step": grpc.StatusCode.UNAVAILABLE,
    "foreign describe": grpc.StatusCode.UNAVAILABLE,
    "plaintext rows": grpc.StatusCode.UNAVAILABLE,
    "plaintext step": grpc.StatusCode.UNAVAILABLE,
    "gateway rows": grpc.StatusCode.PERMISSION_DENIED,
    "admin rows": grpc.StatusCode.PERMISSION_DENIED,
    "tracker step": grpc.StatusCode.PERMISSION_DENIED,
    "impostor worker rows": grpc.StatusCode.PERMISSION_DENIED,  # a worker, but not the listed node 1
    "node 1 rows": grpc.StatusCode.FAILED_PRECONDITION,  # authorized; node 1's stream is up already
    "admin step": grpc.StatusCode.FAILED_PRECONDITION,  # authorized; step 10**6 is out of order
    "tracker describe": grpc.StatusCode.OK,
}


def _driver_refuses_a_gateway_server(data: Path, driver: LinkSecurity) -> None:
    """A server with a swarm gateway certificate is not a node: the driver's handshake fails on
    the pinned worker name. Control: pinned to the name that certificate does carry, the same
    handshake succeeds (the empty server then answers UNIMPLEMENTED)."""
    impostor = minted_security(data, "fake-node", "gateway")
    loop = LoopThread("impostor")  # the server runs while this thread blocks in the driver

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        port = bind(server, "127.0.0.1:0", impostor)
        await server.start()
        return server, port

    server, port = loop.call(start())
    address = f"127.0.0.1:{port}"
    try:
        with pytest.raises(Unavailable, match=r"(?i)handshake|ssl|certificate|connect"):
            ExpertGroupClient([address], step_timeout_s=5, security=driver)
        pinned = hop_server_name(impostor.identity.node_id)
        control = call_status(address, driver, lambda stub: stub.DescribeExpertNode(QUERY, timeout=5), pinned)
        assert control == grpc.StatusCode.UNIMPLEMENTED
    finally:
        loop.call(server.stop(None))
        loop.close()


def test_group_under_mtls_matches_whole_model_and_refuses_intruders(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path / "moe.gguf", SPEC)
    data = tmp_path / "data"
    settings = {"threads": 1, "max_sessions": 2, "n_ctx_per_session": 512, "expert_timeout": 30.0}
    peers, children, driver = launch_secure_group(tmp_path, model, 2, settings)
    whole = LlamaBackend(
        SliceCache(tmp_path / "ref").shard_files(model, LayerRange(0, SPEC.n_layers), SPEC.n_layers).slice, CONFIG
    )
    group = ExpertGroupClient(peers, step_timeout_s=30, security=driver)
    try:

        def intrude(step: int) -> None:
            if step == 5:  # mid-generation: the intruders, then the same session goes on
                outcomes = _intrusions(peers, data, tmp_path / "other-swarm", group.nodes[0].model_sha256)
                assert outcomes == EXPECTED
                _driver_refuses_a_gateway_server(data, driver)

        prompt = np.random.default_rng(11).integers(3, 290, 60).astype(np.int32)
        decode_bitwise(whole, group, prompt, 12, intrude)
        assert [n.peers_connected for n in group.describe()] == [1, 1]  # the group's own streams stayed up
        group.close()
        assert [child.stop() for child in children] == [0, 0]  # SIGTERM: a clean exit within the grace
    finally:
        group.close()
        whole.close()
        stop_all(children)
