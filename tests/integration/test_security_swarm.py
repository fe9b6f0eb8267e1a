"""A secured swarm (tracker, two real workers, gateway, as processes) against intruders.

Every check is a real TLS handshake or gRPC call: no client certificate, another CA, an expired
certificate, a revoked one, a worker certificate used as a gateway, a node speaking for another,
a rogue worker with no invite, invites used up / expired / forged, cancelling another party's
session. Each is refused with its status, nothing is routed to the intruder, and a legitimate
generation running alongside is unaffected.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from swarm_harness import MODEL_NAME, Swarm, chat_body, write_tiny_model

from meshnet.core.errors import PermissionDenied, Unauthenticated, Unavailable
from meshnet.core.events import TokenGenerated
from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.ids import NodeId, new_request_id, new_session_id
from meshnet.core.tracking import NodeLoad
from meshnet.membership.join import join_swarm
from meshnet.membership.tracker_client import TrackerClient
from meshnet.process.launcher import meshnet_command
from meshnet.route.driver import RouteDriver
from meshnet.route.route_run import RouteSession
from meshnet.route.shard_admin import fetch_metrics
from meshnet.route.shard_stream import ChannelPool
from meshnet.security.certificates import create_authority, mint_node
from meshnet.security.identity import Role
from meshnet.security.invites import InviteRefused, JoinToken, parse_token
from meshnet.security.swarm_dir import load_authority, load_identity, local_identity
from meshnet.wire import services
from meshnet.wire.frames import DEFAULT_MAX_FRAME_BYTES
from meshnet.wire.tls import LinkSecurity

PROMPT_IDS = (1, 2, 3, 4, 5, 6, 7, 8)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    root = tmp_path_factory.mktemp("secure-swarm")
    with Swarm(root, write_tiny_model(root)) as running:
        running.start_tracker()
        running.start_workers("0:3", "3:6")
        running.start_gateway()
        running.wait_routable(2)
        yield running


def identity(swarm: Swarm, name: str, role: Role) -> LinkSecurity:
    return LinkSecurity(load_identity(local_identity(swarm.root, name, role, time.time())))


def join_address(swarm: Swarm) -> str:
    return (swarm.root / "swarm" / "join-address").read_text().strip()


def invite(swarm: Swarm, *flags: str) -> JoinToken:
    done = subprocess.run(
        meshnet_command(swarm.root, "swarm", "invite", *flags), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return parse_token(done.stdout.strip())


async def list_models_as(swarm: Swarm, security: LinkSecurity | None) -> object:
    async with TrackerClient(swarm.tracker_address, timeout_s=3.0, security=security) as client:
        return await client.list_models()


def test_the_secured_swarm_serves_chat_and_logs_no_text(swarm: Swarm) -> None:
    base_url = swarm.gateways[0].ready_line.split()[3]
    prompt = "the quokka marmalade zeppelin"
    body = chat_body(max_tokens=24, stream=False, content=prompt)
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60, headers=swarm.auth)
    assert response.status_code == 200, response.text
    answer = response.json()["choices"][0]["message"]["content"]
    assert len(answer) > 10
    for log in swarm.root.glob("*.log"):
        text = log.read_text(errors="replace")
        assert prompt not in text, log
        assert answer not in text, log


async def test_no_client_certificate_fails_the_handshake(swarm: Swarm) -> None:
    ca_pem = load_authority(swarm.root).cert_pem
    credentials = grpc.ssl_channel_credentials(ca_pem)  # trusts the CA, presents nothing
    options = [("grpc.ssl_target_name_override", "tracker.meshnet")]
    async with grpc.aio.secure_channel(swarm.tracker_address, credentials, options=options) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await services.TrackerStub(channel).ListModels(services.ListModelsRequest(), timeout=3.0)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # the TLS handshake itself fails
    # and plaintext gets nowhere either
    with pytest.raises(Unavailable):
        await list_models_as(swarm, None)


async def test_a_certificate_of_another_ca_is_refused(swarm: Swarm, tmp_path: Path) -> None:
    foreign = create_authority("intruder", time.time())
    node = mint_node(foreign, node_id="n-rogue", role="gateway", now_unix_s=time.time())
    # The intruder trusts our CA (public), but presents its own CA's certificate.
    rogue = LinkSecurity(type(node)(node.key_pem, node.cert_pem, load_authority(swarm.root).cert_pem))
    with pytest.raises(Unavailable):
        await list_models_as(swarm, rogue)
    pool = ChannelPool(DEFAULT_MAX_FRAME_BYTES, rogue)
    try:
        with pytest.raises(Unavailable):
            await fetch_metrics(pool, swarm.workers[0].address, timeout_s=3.0)
    finally:
        await pool.close()


async def test_an_expired_certificate_is_refused(swarm: Swarm) -> None:
    authority = load_authority(swarm.root)
    hour_ago = time.time() - 7200
    node = mint_node(authority, node_id="g-expired", role="gateway", now_unix_s=hour_ago, lifetime_s=3600)
    with pytest.raises(Unavailable):
        await list_models_as(swarm, LinkSecurity(node))


async def test_a_worker_certificate_cannot_act_as_a_gateway(swarm: Swarm) -> None:
    worker = identity(swarm, "fake-worker-as-gateway", "worker")
    async with TrackerClient(swarm.tracker_address, timeout_s=3.0, security=worker) as client:
        with pytest.raises(PermissionDenied, match="may not call ChooseRoute"):
            await client.choose_route(MODEL_NAME)


async def test_a_node_speaks_only_for_itself(swarm: Swarm) -> None:
    other = identity(swarm, "impostor", "worker")
    victim = NodeId(swarm.workers[1].node_id)
    async with TrackerClient(swarm.tracker_address, timeout_s=3.0, security=other) as client:
        with pytest.raises(PermissionDenied):
            await client.heartbeat(victim, NodeLoad(0, 1, 0, 0.0))
        with pytest.raises(PermissionDenied):
            await client.deregister(victim)
    await asyncio.to_thread(swarm.wait_routable, 2)  # the victim is still routed


async def test_a_gateway_pinning_one_node_cannot_reach_another(swarm: Swarm) -> None:
    pool = ChannelPool(DEFAULT_MAX_FRAME_BYTES, swarm.security)
    try:
        first, second = swarm.workers[0], swarm.workers[1]
        await pool.stub(first.address, first.node_id).GetMetrics(services.MetricsRequest(), timeout=3.0)
        with pytest.raises(grpc.aio.AioRpcError) as wrong:
            # The address of the first node, the identity of the second: the handshake fails.
            await pool.stub(first.address, second.node_id).GetMetrics(services.MetricsRequest(), timeout=3.0)
        assert wrong.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await pool.close()


def test_a_rogue_worker_without_an_invite_never_starts(swarm: Swarm, tmp_path: Path) -> None:
    done = subprocess.run(
        meshnet_command(
            tmp_path,
            "worker",
            "--fake-layers",
            "6",
            "--layers",
            "0:3",
            "--port",
            "0",
            "--tracker",
            swarm.tracker_address,
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no swarm identity" in done.stderr


def test_invites_are_spent_expire_and_cannot_be_forged(swarm: Swarm, tmp_path: Path) -> None:
    token = invite(swarm, "--role", "gateway", "--uses", "1", "--join-address", join_address(swarm))
    joined = join_swarm(token, tmp_path / "first")
    assert LinkSecurity(joined).identity.role == "gateway"
    with pytest.raises(InviteRefused, match="already used 1 of 1"):
        join_swarm(token, tmp_path / "second")
    # An invite whose lifetime is over by the time it is used, without waiting out a lifetime:
    # it expires the moment it is issued, and the tracker judges it on its own clock.
    spent = invite(swarm, "--expires", "0s", "--join-address", join_address(swarm))
    with pytest.raises(InviteRefused, match="expired"):
        join_swarm(spent, tmp_path / "third")
    forged = JoinToken(token.ca_fingerprint, "x" * 32, token.join_address)
    with pytest.raises(InviteRefused, match="unknown"):
        join_swarm(forged, tmp_path / "fourth")
    other_ca = JoinToken("0" * 64, token.secret, token.join_address)
    with pytest.raises(PermissionDenied, match="does not present the swarm CA"):
        join_swarm(other_ca, tmp_path / "fifth")


async def test_fuzzed_join_calls_get_typed_statuses(swarm: Swarm) -> None:
    """Malformed Join calls over the wire: INVALID_ARGUMENT / PERMISSION_DENIED, the tracker serves on."""
    ca_pem = load_authority(swarm.root).cert_pem
    credentials = grpc.ssl_channel_credentials(ca_pem)
    options = [("grpc.ssl_target_name_override", "tracker.meshnet")]
    seen = set()
    async with grpc.aio.secure_channel(join_address(swarm), credentials, options=options) as channel:
        stub = services.SwarmStub(channel)
        for index in range(200):
            secret = "s" * (index % 150)
            csr = bytes((index * 7 + k) % 256 for k in range(index * 5))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Join(services.SwarmJoinRequest(invite_secret=secret, csr_pem=csr), timeout=5.0)
            seen.add(refused.value.code())
    assert seen <= {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED}
    assert await list_models_as(swarm, swarm.security)


async def ticketed_session(swarm: Swarm) -> RouteSession:
    """A new session on the route the tracker chooses, with its ticket (given to the test's gateway)."""
    request_id, session_id = new_request_id(), new_session_id()
    async with TrackerClient(swarm.tracker_address, security=swarm.security) as tracker:
        route = await tracker.choose_route(MODEL_NAME, session_id=session_id, request_id=request_id)
    return RouteSession(request_id, session_id, route.hops, route.fingerprint, route.epoch, route.ticket)


async def _generate(pool: ChannelPool, session: RouteSession, max_tokens: int, started: asyncio.Event) -> int:
    driver = RouteDriver(pool, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES)
    count = 0
    async for event in driver.run(session, GenerationRequest(PROMPT_IDS, max_tokens, SamplingParams())):
        count += isinstance(event, TokenGenerated)
        if count == 3:
            started.set()
    return count


async def test_only_the_opener_may_cancel_a_session(swarm: Swarm) -> None:
    session = await ticketed_session(swarm)
    owner = ChannelPool(DEFAULT_MAX_FRAME_BYTES, swarm.security)
    intruder = ChannelPool(DEFAULT_MAX_FRAME_BYTES, identity(swarm, "other-gateway", "gateway"))
    try:
        started = asyncio.Event()
        running = asyncio.create_task(_generate(owner, session, 120, started))
        await asyncio.wait_for(started.wait(), timeout=30)
        head = session.hops[0]
        cancel = services.CancelRequest(session_id=session.session_id, reason="hostile")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await intruder.stub(head.address, head.node_id).Cancel(cancel, timeout=3.0)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert await asyncio.wait_for(running, timeout=120) == 120  # the owner's generation is untouched
    finally:
        await owner.close()
        await intruder.close()


async def test_a_worker_certificate_cannot_drive_a_routes_head(swarm: Swarm) -> None:
    """Workers open sessions on their downstream neighbour only: the head refuses a worker's first
    frame (PERMISSION_DENIED before it runs anything), while a gateway's same request is served."""
    rogue = ChannelPool(DEFAULT_MAX_FRAME_BYTES, identity(swarm, "worker-as-client", "worker"))
    gateway = ChannelPool(DEFAULT_MAX_FRAME_BYTES, swarm.security)
    try:
        session = await ticketed_session(swarm)
        with pytest.raises(PermissionDenied, match="never on a route's head"):
            await _generate(rogue, session, 4, asyncio.Event())
        served = await ticketed_session(swarm)
        assert await _generate(gateway, served, 4, asyncio.Event()) == 4
    finally:
        await rogue.close()
        await gateway.close()


async def test_revoked_worker_leaves_routes_and_is_refused_everywhere(swarm: Swarm) -> None:
    (spare,) = await asyncio.to_thread(swarm.start_workers, "3:6")
    await asyncio.to_thread(swarm.wait_routable, 3)
    spare_identity = LinkSecurity(load_identity(swarm.root / "swarm" / "nodes" / spare.component.spec.name))
    legit = swarm.workers[0]
    pool = ChannelPool(DEFAULT_MAX_FRAME_BYTES, spare_identity)
    try:
        await fetch_metrics(pool, legit.address, timeout_s=3.0)  # a member may probe its peers
        revoke = meshnet_command(swarm.root, "swarm", "revoke", spare.node_id, "--tracker", swarm.tracker_address)
        done = await asyncio.to_thread(subprocess.run, revoke, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "removed from routing" in done.stdout
        await asyncio.to_thread(swarm.wait_routable, 2, 5.0)
        async with TrackerClient(swarm.tracker_address, security=swarm.security) as tracker:
            for _ in range(5):
                route = await tracker.choose_route(MODEL_NAME)
                assert spare.node_id not in route.node_ids
        async with TrackerClient(swarm.tracker_address, security=spare_identity) as revoked:
            with pytest.raises(Unauthenticated, match="revoked"):
                await revoked.list_models()
        # Workers follow the list over their revocation watch: it arrives within moments.
        deadline = time.monotonic() + 5.0
        while True:
            try:
                await fetch_metrics(pool, legit.address, timeout_s=3.0)
            except Unauthenticated:
                break
            assert time.monotonic() < deadline, "the worker still accepts the revoked certificate"
            await asyncio.sleep(0.1)
    finally:
        await pool.close()
        spare.component.stop()
