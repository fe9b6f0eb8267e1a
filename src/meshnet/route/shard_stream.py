"""A route session's stream to one shard, and the channels those streams share.

One long-lived bidirectional stream per route session per seam: the sender (the route driver,
or a shard forwarding its boundary) writes a frame per step and reads the shard's answer.
Closing or cancelling the stream is what tells the shard to free that session's KV, and the
shard then closes its own stream to the next hop, and so on down the route.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import grpc.aio

from meshnet.core.addresses import parse_relayed
from meshnet.core.errors import MeshnetError, Unavailable
from meshnet.core.ids import RequestId, SessionId
from meshnet.membership.channel import RETIRED_GRACE_S, RenewingChannel
from meshnet.wire import services
from meshnet.wire.frames import StepFrame, StepResult
from meshnet.wire.shard_wire import frame_to_proto, result_from_proto, ring_open_to_proto
from meshnet.wire.status import error_from_rpc
from meshnet.wire.tls import LinkSecurity, hop_server_name, link_options


class ChannelPool:
    """One channel per peer (address and the node expected there), reused by every stream to it.

    Secured, each channel pins the node id the route names for that address in the TLS
    handshake (``wire.tls``), so a different node at that address fails the handshake. Each is a
    ``RenewingChannel``: after a renewal new streams go over a channel with the new certificate,
    while the streams already open finish on the old one, which closes with the pool.

    A node behind NAT is at ``NODE@RELAY`` and moves with its relay; each relayed channel holds a
    forwarder (a listening socket and a channel to the relay). So once a node is asked for at
    another relayed address, its channels at the others are retired: they take no new call, and
    close as soon as the calls running on them ended (``RETIRED_GRACE_S`` at most). A stale
    route still naming the old address gets a fresh channel there, retired in turn: the pool
    holds one relayed channel per node, plus those still draining."""

    def __init__(self, max_frame_bytes: int, security: LinkSecurity | None = None) -> None:
        self._options = link_options(max_frame_bytes)
        self._security = security
        self._channels: dict[tuple[str, str], RenewingChannel] = {}
        self._retiring: dict[asyncio.Task[None], RenewingChannel] = {}

    def stub(self, address: str, node_id: str | None = None) -> services.ShardStub:
        return services.ShardStub(self.channel(address, node_id))

    def channel(self, address: str, node_id: str | None = None) -> grpc.aio.Channel:
        """The channel of the current certificate to the node ``node_id`` at ``address`` (the
        health service shares it)."""
        key = (address, node_id or "")
        channel = self._channels.get(key)
        if channel is None:
            self._retire_moved(address)
            channel = RenewingChannel(address, self._security, hop_server_name(node_id), self._options)
            self._channels[key] = channel
        return channel.channel()

    def _retire_moved(self, address: str) -> None:
        """The node at relayed ``address`` is not at its other relayed addresses any more."""
        relayed = parse_relayed(address)
        if relayed is None:
            return
        for key in [key for key in self._channels if key[0] != address and _relayed_node(key[0]) == relayed.node_id]:
            retired = self._channels.pop(key)
            task = asyncio.get_running_loop().create_task(retired.close(grace=RETIRED_GRACE_S))
            self._retiring[task] = retired
            task.add_done_callback(self._retired)

    def _retired(self, task: asyncio.Task[None]) -> None:
        self._retiring.pop(task, None)

    @property
    def addresses(self) -> frozenset[str]:
        """The addresses the pool holds an open channel to (retired ones not counted)."""
        return frozenset(address for address, _ in self._channels)

    async def close(self) -> None:
        retiring, self._retiring = dict(self._retiring), {}
        for task in retiring:
            task.cancel()  # their calls get the pool's own short grace below instead
        await asyncio.gather(*retiring, return_exceptions=True)
        channels, self._channels = [*self._channels.values(), *retiring.values()], {}
        await asyncio.gather(*(c.close(grace=1.0) for c in channels), return_exceptions=True)


def _relayed_node(address: str) -> str | None:
    relayed = parse_relayed(address)
    return None if relayed is None else relayed.node_id


class _EndedCall(grpc.RpcError):
    """A finished call's status in the shape ``error_from_rpc`` reads."""

    def __init__(self, code: grpc.StatusCode, details: str | None, metadata: Any) -> None:
        super().__init__()
        self._code, self._details, self._metadata = code, details, metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str | None:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._metadata


class ShardStream:
    def __init__(self, pool: ChannelPool, address: str, timeout: float | None, node_id: str | None = None) -> None:
        self.address = address
        self._call = pool.stub(address, node_id).Session(timeout=timeout)

    async def exchange(self, frame: StepFrame) -> StepResult:
        """Send one frame and wait for the next shard's answer to it."""
        await self.send(frame)
        return await self.read()

    async def send(self, frame: StepFrame) -> None:
        """Send one frame without waiting for an answer (a ring frame gets none on this stream)."""
        try:
            await self._call.write(frame_to_proto(frame))
        except (grpc.RpcError, asyncio.InvalidStateError):
            # The call already ended (the shard died or aborted since the last step): report
            # how it ended, not the write's own complaint about a finished call.
            raise await self._ended() from None

    async def finish_writing(self) -> None:
        """Half-close: the next shard sees the stream end and releases the session."""
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError, RuntimeError):
            await self._call.done_writing()

    async def _ended(self) -> MeshnetError:
        try:
            code = await asyncio.wait_for(self._call.code(), timeout=1.0)
            details = await self._call.details()
            metadata = await self._call.trailing_metadata()
        except (TimeoutError, grpc.RpcError, asyncio.CancelledError):
            return Unavailable(f"shard {self.address} is unreachable")
        error = error_from_rpc(_EndedCall(code, details, metadata))
        if type(error) is MeshnetError or code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
            return Unavailable(f"shard {self.address} ended the session stream: {error.message}")
        return error

    async def read(self) -> StepResult:
        """The next answer on the stream (after a frame that asked the head to decode on, one per step)."""
        try:
            response = await self._call.read()
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        if response is grpc.aio.EOF:
            status = await self._call.code()
            raise Unavailable(f"shard {self.address} closed the session stream ({status})")
        return result_from_proto(response)

    async def close(self) -> None:
        """End the stream: the next shard releases the session and closes its own link."""
        try:
            await self._call.done_writing()
            # Wait briefly for the next shard to finish releasing, then stop waiting regardless.
            await asyncio.wait_for(self._call.read(), timeout=1.0)
        except (grpc.RpcError, asyncio.InvalidStateError, RuntimeError, TimeoutError):
            pass
        finally:
            self._call.cancel()  # even when the wait is cancelled: the next shard must let go

    def cancel(self) -> None:
        self._call.cancel()


class RingStream:
    """The head's end of a session's ring: the tail's answers to ring frames, read in order."""

    def __init__(
        self,
        pool: ChannelPool,
        address: str,
        session_id: SessionId,
        request_id: RequestId,
        timeout: float | None,
        node_id: str | None = None,
    ) -> None:
        self.address = address
        self._call = pool.stub(address, node_id).RingReturn(ring_open_to_proto(session_id, request_id), timeout=timeout)

    async def read(self) -> StepResult:
        try:
            response = await self._call.read()
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        if response is grpc.aio.EOF:
            raise Unavailable(f"the tail {self.address} closed the session's ring")
        return result_from_proto(response)

    def cancel(self) -> None:
        self._call.cancel()
