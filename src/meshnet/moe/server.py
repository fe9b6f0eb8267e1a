"""``meshnet worker --experts I/N --expert-peers A0,...,AN-1``: the expert node's process and service.

Start-up: certify the mechanism on a tiny MoE of the served family and types (refuse to serve
otherwise), load the model (``node.ExpertNode``), listen, form the group; the ready line is
printed once all N-1 row streams are up. Then serve until SIGTERM or SIGINT, which also ends a
start-up still waiting for its peers.

One event loop in the main thread serves grpc.aio; the engine runs on a thread of its own.
Links are mutual TLS from the swarm CA, like every other meshnet link (``--identity``; plaintext
only with ``--insecure`` on loopback): every RPC is admitted by the caller's role and, for a row
stream, by the node id listed for the index it claims (``security.policy.authorize_expert``).
With ``--tracker`` a node also takes the swarm's revocation list (``moe/watch.py``) and renews
its certificate; a list naming a member of its group makes it leave the group
(``ExpertNode.on_revoked``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable

import grpc
import grpc.aio

from meshnet.core.errors import FailedPrecondition, InvalidArgument, MeshnetError
from meshnet.moe import wire as expert_wire
from meshnet.moe.certification import certify_expert_parallel
from meshnet.moe.config import ExpertNodeConfig
from meshnet.moe.links import PeerLink
from meshnet.moe.node import ExpertNode
from meshnet.moe.watch import watch_tracker
from meshnet.security.policy import ExpertRpc, authorize_expert
from meshnet.wire.status import abort_with
from meshnet.wire.tls import LinkSecurity, bind, enforce

log = logging.getLogger(__name__)
STARTUP_TIMEOUT_S = 120.0
"""How long a node waits for its group to form (its peers certify and load first)."""
STOP_GRACE_S = 1.0
"""Calls still running at shutdown get this long before they are cancelled."""


class ExpertNodeServicer(expert_wire.ExpertGroupServicer):
    """The thin service over ``ExpertNode``: admission, then the node's own methods."""

    def __init__(self, node: ExpertNode) -> None:
        self._node = node

    async def _admit(
        self, context: grpc.aio.ServicerContext, rpc: ExpertRpc, listed_node_id: str | None = None
    ) -> str | None:
        """The caller's node id if its certificate may call ``rpc``, else abort the call (None: insecure)."""
        security = self._node.security
        if security is None:
            return None
        try:
            caller = security.peer(context)
            revoked = security.revocations.current()
            enforce(authorize_expert(caller, rpc, revoked=revoked, listed_node_id=listed_node_id))
        except MeshnetError as error:
            await abort_with(context, error)
        return caller.node_id

    async def ExchangeRows(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        """A higher-indexed peer's row stream: its opening message, then frames both ways until
        either side ends it (this node ends it by returning)."""
        caller = await self._admit(context, "ExchangeRows")
        node = self._node
        opening = await context.read()
        if not isinstance(opening, expert_wire.ExpertRowsFrame):
            return  # the caller half-closed before saying who it is
        peer = opening.sender
        if not node.ownership.index < peer < node.ownership.count or opening.model_sha256 != node.model_sha256:
            await abort_with(context, InvalidArgument(f"row stream from node {peer} of another group or model refused"))
        if node.peers[peer].node_id is not None:
            await self._admit(context, "ExchangeRows", node.peers[peer].node_id)
        link = PeerLink(node.ownership.index, peer, context.write)
        refused = node.admit_link(link, caller)
        if refused is not None:
            await abort_with(context, refused)
        await link.serve(context.read)

    async def ExpertStep(
        self, request: expert_wire.ExpertStepRequest, context: grpc.aio.ServicerContext
    ) -> expert_wire.ExpertStepReply:
        await self._admit(context, "ExpertStep")
        try:
            return await self._node.step(request)
        except MeshnetError as error:
            await abort_with(context, error)

    async def ExpertRelease(
        self, request: expert_wire.ExpertReleaseRequest, context: grpc.aio.ServicerContext
    ) -> expert_wire.ExpertReleaseReply:
        await self._admit(context, "ExpertRelease")
        try:
            await self._node.release(request.slot)
        except MeshnetError as error:
            await abort_with(context, error)
        return expert_wire.ExpertReleaseReply()

    async def DescribeExpertNode(
        self, request: expert_wire.ExpertNodeQuery, context: grpc.aio.ServicerContext
    ) -> expert_wire.ExpertNodeInfo:
        """Also the driver's liveness probe: answered by the loop while the engine computes."""
        await self._admit(context, "DescribeExpertNode")
        return expert_wire.node_info_to_proto(self._node.describe())


def serve_expert_node(
    config: ExpertNodeConfig, on_ready: Callable[[str, str], None], security: LinkSecurity | None = None
) -> None:
    """Certify, load, listen, connect the group, call ``on_ready(address, checks)``, serve until SIGTERM.

    ``security``: this node's identity; None serves plaintext (``--insecure``, loopback only)."""
    checks = certify_expert_parallel(config.model, config.ownership.count, config.certification_llama)
    asyncio.run(_serve(config, f"{len(checks)} certification checks", on_ready, security))


async def _serve(
    config: ExpertNodeConfig, checks: str, on_ready: Callable[[str, str], None], security: LinkSecurity | None
) -> None:
    node = ExpertNode(config, security)
    try:
        server, address = _listen(node, security)
        await _serve_group(node, server, lambda: on_ready(address, checks))
    finally:
        await node.close()


def _listen(node: ExpertNode, security: LinkSecurity | None) -> tuple[grpc.aio.Server, str]:
    """The node's server, bound (not started yet), and the address it listens on."""
    # Exclusive, as a worker's port: a second node started on a taken port must fail, not share it.
    server = grpc.aio.server(options=[*expert_wire.CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)])
    expert_wire.add_expert_group_servicer(ExpertNodeServicer(node), server)
    host, target = node.config.host, f"{node.config.host}:{node.config.port}"
    try:
        return server, f"{host}:{bind(server, target, security)}"
    except RuntimeError as error:  # grpc's only word for it; the port is most likely taken
        raise FailedPrecondition(f"the expert node cannot listen on {target} (is the port in use?): {error}") from None


async def _serve_group(node: ExpertNode, server: grpc.aio.Server, ready: Callable[[], None]) -> None:
    """Serve, form the group, say ready, serve until a stop signal; then stop serving."""
    stopping = _stop_on_signals()
    await server.start()
    watch_stop = threading.Event()
    watch = None
    tracker, security = node.config.tracker, node.security
    if tracker and security is not None:
        watch = watch_tracker(tracker, security, node.on_revoked, watch_stop)
    elif tracker:
        log.warning("--tracker is ignored with --insecure: there are no certificates to revoke or renew")
    try:
        forming = asyncio.create_task(node.form_group(STARTUP_TIMEOUT_S))
        await asyncio.wait({forming, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if stopping.done():  # stopped before the group formed
            forming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await forming
            return
        forming.result()  # raises why the group did not form
        ready()
        await stopping
    finally:
        watch_stop.set()  # ends the tracker watch
        if watch is not None:
            await asyncio.to_thread(watch.join, 5.0)
        node.exchange.close()  # a step still running fails at once instead of holding the stop
        await server.stop(grace=STOP_GRACE_S)


def _stop_on_signals() -> asyncio.Task[bool]:
    """A task that ends on the first SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return asyncio.create_task(stop.wait())
