"""Helpers for tests of networked expert-parallel groups: a group under mTLS, the bitwise
comparison of a group with the whole model, and single calls on one node that report their status.

Identities are minted from a data dir's CA as ``meshnet up`` does (``deploy.up_moe``): every node
a worker certificate, listed to its peers by node id; another data dir is another swarm.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import numpy as np

from meshnet.deploy.expert_launch import expert_group_specs, expert_node
from meshnet.deploy.up_moe import minted_security, minted_worker_identity
from meshnet.engine.backend import Backend, StepInput
from meshnet.engine.bitwise import bit_identical
from meshnet.moe import wire as expert_wire
from meshnet.process.launcher import ChildProcess, launch_all
from meshnet.security.identity import ANY_WORKER_NAME
from meshnet.wire.tls import LinkSecurity, secure_or_plain_channel


def launch_secure_group(
    root: Path, model: Path, size: int, settings: Mapping[str, Any]
) -> tuple[list[str], list[ChildProcess], LinkSecurity]:
    """Start ``size`` nodes (``settings``: their ``WorkerConfig`` fields) with worker identities of
    ``root/data``'s swarm; their addresses, the processes (the caller stops them) and a gateway
    identity to drive them with."""
    data = root / "data"
    node = replace(expert_node(data, model, size), **settings)
    peers, specs = expert_group_specs(node, root, identity=minted_worker_identity(data))
    assert all("--identity" in spec.command and "--insecure" not in spec.command for spec in specs)
    children = launch_all(specs, timeout_s=240)
    return peers, children, minted_security(data, "driver", "gateway")


def decode_bitwise(
    whole: Backend, group: Backend, prompt: np.ndarray, steps: int, between: Callable[[int], None] = lambda _: None
) -> int:
    """Prefill ``prompt`` in slot 0, then greedy-decode on both: every logit of the group must
    equal the whole model's bit for bit over ``steps`` steps (``between(step)`` runs after each).
    Returns the next position of the session."""
    batch = [StepInput(0, 0, tokens=prompt, want_logits="all")]
    position = len(prompt)
    for step in range(steps):
        want, got = whole.run(batch)[0].logits, group.run(batch)[0].logits
        assert want is not None and got is not None
        assert bit_identical(want, got), f"step {step} differs"
        batch = [StepInput(0, position, tokens=np.array([int(np.argmax(want[-1]))], np.int32))]
        position += 1
        between(step)
    return position - 1  # the last batch built above was not run


CALL_TIMEOUT_S = 20.0
Stub = expert_wire.ExpertGroupStub
T = TypeVar("T")


def on_node(
    address: str,
    security: LinkSecurity | None,
    action: Callable[[Stub], Awaitable[T]],
    server_name: str = ANY_WORKER_NAME,
) -> T:
    """``action(stub)`` over a fresh channel to one node (so a fresh handshake), pinned to ``server_name``."""

    async def run() -> T:
        channel = secure_or_plain_channel(address, security, server_name, expert_wire.CHANNEL_OPTIONS)
        try:
            return await action(expert_wire.ExpertGroupStub(channel))
        finally:
            await channel.close()

    return asyncio.run(run())


def call_status(
    address: str,
    security: LinkSecurity | None,
    action: Callable[[Stub], Awaitable[object]],
    server_name: str = ANY_WORKER_NAME,
) -> grpc.StatusCode:
    """The status ``action``'s call on one node ends with."""
    try:
        on_node(address, security, action, server_name)
    except grpc.RpcError as error:
        return error.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def rows_call(
    address: str, security: LinkSecurity | None, sender: int, model_sha256: str, *, opening: bool = True
) -> grpc.StatusCode:
    """Open ExchangeRows as node ``sender`` and read until the server ends the stream: its status.

    ``opening=False`` sends nothing: for a certificate the node refuses as the stream opens. Had
    we written the opening frame, the refusal could end the call while the frame was in flight,
    and grpc then ends it INTERNAL ("Internal error from Core") instead of the node's status."""

    async def open_rows(stub: Stub) -> None:
        call = stub.ExchangeRows(timeout=CALL_TIMEOUT_S)
        if opening:
            await call.write(expert_wire.ExpertRowsFrame(sender=sender, model_sha256=model_sha256))
        # Our side stays open: only the server can end the call (a refusal raises from read).
        while await call.read() is not grpc.aio.EOF:
            pass

    return call_status(address, security, open_rows)


def step_call(address: str, security: LinkSecurity | None, rpc: str) -> grpc.StatusCode:
    """One unary call (a step the nodes would refuse as out of order, or a describe): its status."""

    async def unary(stub: Stub) -> object:
        if rpc == "ExpertStep":
            items = [expert_wire.ExpertStepItem(1, 0, np.array([5], np.int32), "last")]
            return await stub.ExpertStep(expert_wire.step_to_proto(10**6, items), timeout=CALL_TIMEOUT_S)
        return await stub.DescribeExpertNode(expert_wire.ExpertNodeQuery(), timeout=CALL_TIMEOUT_S)

    return call_status(address, security, unary)


TOLERATED_PINGS = 2
"""gRPC's default ``grpc.http2.max_ping_strikes``: a server left at its defaults answers the third
ping without data (within its five-minute minimum interval) with GOAWAY too_many_pings."""


def assert_connections_outlive_keepalives(targets: Sequence[str], pings: int, timeout_s: float) -> None:
    """Wait until this process's connection to each of ``targets`` has sent ``pings`` more
    keepalive pings (as gRPC's channelz counts them), failing at once if one of those
    connections closes: a server that refuses the pings ends it with GOAWAY too_many_pings."""
    deadline = time.monotonic() + timeout_s
    start = _connection_by_target(targets)
    while True:
        now = _connection_by_target(targets)
        for target, (socket, sent) in start.items():
            if now[target][0] != socket:
                raise AssertionError(f"the connection to {target} closed after {sent}+ keepalive pings (GOAWAY?)")
        if all(now[target][1] >= start[target][1] + pings for target in targets):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"keepalive pings to {list(targets)} after {timeout_s:g} s: {start} -> {now}")
        time.sleep(0.05)


def _connection_by_target(targets: Sequence[str]) -> dict[str, tuple[int | None, int]]:
    """(socket id, keepalive pings sent) of this process's one connection to each target."""
    found: dict[str, tuple[int | None, int]] = {target: (None, 0) for target in targets}
    for socket, channel_target, sent in _client_sockets():
        for target in targets:
            if channel_target.endswith(target):
                found[target] = (socket, sent)
    return found


def _client_sockets() -> list[tuple[int, str, int]]:
    """(socket id, channel target, keepalives sent) of every client connection of this process.

    Read from gRPC's channelz through the functions the grpcio-channelz service wraps (that
    package is not a dependency here)."""
    from grpc._cython import cygrpc

    found = []
    for channel in json.loads(cygrpc.channelz_get_top_channels(0)).get("channel", []):
        target = channel.get("data", {}).get("target", "")
        for ref in channel.get("subchannelRef", []):
            subchannel = json.loads(cygrpc.channelz_get_subchannel(int(ref["subchannelId"])))["subchannel"]
            for socket_ref in subchannel.get("socketRef", []):
                socket_id = int(socket_ref["socketId"])
                data = json.loads(cygrpc.channelz_get_socket(socket_id))["socket"].get("data", {})
                found.append((socket_id, target, int(data.get("keepAlivesSent", 0))))
    return found
