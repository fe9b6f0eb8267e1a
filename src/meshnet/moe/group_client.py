"""Drive an expert-parallel group over gRPC: every batch runs on every node at once.

The group is a ``Backend`` (a ``LocalRoute`` of it generates text), so a step fans out to the
N nodes with a deadline and comes back as one output; the nodes must agree on every logit's
crc32. When a node dies the others' exchanges fail as soon as its streams close, so every call
ends within the step deadline and the caller gets one structured error naming the lost node.
Every node is dialled over mutual TLS (``security``: the driver's own swarm identity, a gateway's
or an admin's), pinned to the name only worker certificates carry; None dials plaintext.

The calls are grpc.aio, on an event loop this driver runs in a thread of its own
(``loop_thread.LoopThread``); the ``Backend`` methods block on them, as their callers expect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import grpc.aio

from meshnet.core.errors import EngineError, InvalidArgument, MeshnetError, Unavailable
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import KeepsNoKv, ShardShape, StepInput, StepOutput
from meshnet.membership.channel import RenewingChannel
from meshnet.moe import wire as expert_wire
from meshnet.moe.loop_thread import LoopThread
from meshnet.security.identity import ANY_WORKER_NAME
from meshnet.wire.status import error_from_rpc
from meshnet.wire.tls import LinkSecurity

PROBE_INTERVAL_S = 0.5
"""How long a step may run before the driver starts asking its pending nodes whether they live."""
PROBE_TIMEOUT_S = 1.0
"""A live node answers a liveness probe within this, even while its engine runs a long step."""

Outcome = expert_wire.ExpertStepReply | MeshnetError


class ExpertGroupClient(KeepsNoKv):
    def __init__(
        self, addresses: Sequence[str], step_timeout_s: float = 30.0, *, security: LinkSecurity | None = None
    ) -> None:
        if not addresses:
            raise InvalidArgument("an expert group needs at least one node address")
        self._addresses = list(addresses)
        self._timeout_s = step_timeout_s
        self._loop = LoopThread("expert-driver")
        self._channels: list[RenewingChannel] = []
        try:
            self._loop.call(self._open(security))
            self.nodes = self.describe()
            self._check_group()
        except BaseException:
            self.close()
            raise
        first = self.nodes[0]
        self._shape = ShardShape(
            LayerRange(0, first.n_layers),
            first.n_layers,
            first.n_embd,
            first.n_vocab,
            "full",
            first.max_sessions,
            first.context,
            first.context,
            1,
        )
        self._step = first.next_step  # a group outlives its drivers: continue its step sequence

    async def _open(self, security: LinkSecurity | None) -> None:
        """The nodes' channels, made on the driver's loop (an aio channel belongs to one loop)."""
        for address in self._addresses:
            self._channels.append(RenewingChannel(address, security, ANY_WORKER_NAME, expert_wire.CHANNEL_OPTIONS))

    @property
    def _stubs(self) -> list[expert_wire.ExpertGroupStub]:
        """Stubs over each node's channel of the current certificate; read on the driver's loop
        only (a renewal opens the new channel there)."""
        return [channel.stub(expert_wire.ExpertGroupStub) for channel in self._channels]

    async def _describe(self, index: int, timeout_s: float) -> expert_wire.ExpertNodeDescription:
        reply = await self._stubs[index].DescribeExpertNode(expert_wire.ExpertNodeQuery(), timeout=timeout_s)
        return expert_wire.node_info_from_proto(reply)

    async def _describe_all(self) -> list[expert_wire.ExpertNodeDescription]:
        replies = await asyncio.gather(
            *(self._describe(i, self._timeout_s) for i in range(len(self._stubs))), return_exceptions=True
        )
        for index, reply in enumerate(replies):
            if isinstance(reply, grpc.RpcError):
                raise Unavailable(f"expert node at {self._addresses[index]}: {error_from_rpc(reply).message}")
            if isinstance(reply, BaseException):
                raise reply
        return replies  # type: ignore[return-value]

    def describe(self) -> list[expert_wire.ExpertNodeDescription]:
        """Every node's description now (its exchange counters included)."""
        return self._loop.call(self._describe_all())

    def _check_group(self) -> None:
        size = len(self.nodes)
        for position, node in enumerate(self.nodes):
            if (node.index, node.group_size) != (position, size):
                raise InvalidArgument(
                    f"{self._addresses[position]} is node {node.index}/{node.group_size}, expected {position}/{size}"
                )
            if node.model_sha256 != self.nodes[0].model_sha256:
                raise InvalidArgument(f"{self._addresses[position]} serves another model than node 0")
            if node.next_step != self.nodes[0].next_step:
                raise Unavailable(f"{self._addresses[position]} is at another step than node 0: the group is broken")

    @property
    def shape(self) -> ShardShape:
        return self._shape

    def run(self, batch: list[StepInput]) -> list[StepOutput]:
        items = []
        for step in batch:
            if step.tokens is None:
                raise InvalidArgument("an expert-parallel group takes token ids")
            items.append(expert_wire.ExpertStepItem(step.slot, step.position, step.tokens, step.want_logits))
        request = expert_wire.step_to_proto(self._step, items)
        self._step += 1
        outcomes = self._loop.call(self._step_all(request))
        replies, failures = [], []
        for index, outcome in enumerate(outcomes):
            try:
                if isinstance(outcome, MeshnetError):
                    raise outcome
                replies.append(expert_wire.outputs_from_proto(outcome, request.step, self._shape.n_vocab))
            except MeshnetError as error:
                failures.append((index, error))
        if failures:
            raise _group_error(failures, self._addresses)
        for other in replies[1:]:
            if [r.crc32 for r in other] != [r.crc32 for r in replies[0]]:
                raise EngineError("the nodes of the expert group returned different logits")
        return [StepOutput(r.slot, logits=r.logits) for r in replies[0]]

    async def _step_all(self, request: expert_wire.ExpertStepRequest) -> list[Outcome]:
        calls = [stub.ExpertStep(request, timeout=self._timeout_s) for stub in self._stubs]
        waiters = [asyncio.ensure_future(_outcome(call)) for call in calls]
        try:
            await self._await_or_probe(waiters)
        finally:
            for call in calls:
                call.cancel()  # a no-op on a finished call
        return [waiter.result() for waiter in waiters]

    async def _await_or_probe(self, waiters: Sequence[asyncio.Future[Outcome]]) -> None:
        """Wait for every node's reply; while one is pending, ask it every PROBE_INTERVAL_S whether
        it is alive. A node that does not answer within PROBE_TIMEOUT_S (frozen, partitioned: its
        sockets stay open, so no stream closes and HTTP/2 keepalive did not notice, measured) ends
        the step with ``Unavailable`` naming it, PROBE_INTERVAL_S + PROBE_TIMEOUT_S after it stopped
        answering at most, not at the step deadline. A node busy with a long step still answers:
        the probe is served by the node's event loop, not its engine thread."""
        pending = set(waiters)
        while pending:
            done, pending = await asyncio.wait(pending, timeout=PROBE_INTERVAL_S, return_when=asyncio.FIRST_COMPLETED)
            if done:
                continue
            silent = [i for i, waiter in enumerate(waiters) if not waiter.done()]
            probes = [self._describe(i, PROBE_TIMEOUT_S) for i in silent]
            for index, probe in zip(silent, await asyncio.gather(*probes, return_exceptions=True), strict=True):
                if isinstance(probe, grpc.RpcError):
                    raise Unavailable(
                        f"expert group node {index} ({self._addresses[index]}) stopped answering during a step "
                        f"(liveness probe: {error_from_rpc(probe).message})"
                    )

    async def _release_all(self, slot: int) -> None:
        request = expert_wire.ExpertReleaseRequest(slot=slot)
        calls = [stub.ExpertRelease(request, timeout=self._timeout_s) for stub in self._stubs]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        failures = [(i, error_from_rpc(o)) for i, o in enumerate(outcomes) if isinstance(o, grpc.RpcError)]
        if failures:
            raise _group_error(failures, self._addresses)

    def truncate(self, slot: int, position: int) -> None:
        if position != 0:
            raise InvalidArgument("an expert group frees whole sessions only")
        self._loop.call(self._release_all(slot))

    def close(self) -> None:
        """Close the channels and stop the driver's loop (idempotent)."""
        channels, self._channels = self._channels, []
        if channels:
            self._loop.call(_close_channels(channels))
        self._loop.close()


class _StepCancelled(Unavailable):
    """A node that ended its step CANCELLED: alive, but stopping, or giving up on a group one of
    whose nodes died. Named only when no node of the step was unreachable (``_group_error``)."""


async def _outcome(call: grpc.aio.UnaryUnaryCall) -> Outcome:
    """A node's reply, or the typed error its call ended with."""
    try:
        return await call
    except grpc.RpcError as error:
        typed = error_from_rpc(error)
        if type(typed) is Unavailable and error.code() == grpc.StatusCode.CANCELLED:
            return _StepCancelled(typed.message)
        return typed


async def _close_channels(channels: list[RenewingChannel]) -> None:
    for channel in channels:
        await channel.close()


def _group_error(failures: list[tuple[int, MeshnetError]], addresses: list[str]) -> MeshnetError:
    """One error for the caller: the node that could not be reached, else the first node's own."""
    unreachable = [
        i
        for i, error in failures
        if "lost" not in error.message and isinstance(error, Unavailable) and not isinstance(error, _StepCancelled)
    ]
    index, error = next(((i, e) for i, e in failures if i in unreachable), failures[0])
    return type(error)(f"expert group node {index} ({addresses[index]}): {error.message}")
