"""Drive an expert-parallel group over gRPC: every batch runs on every node at once.

The group is a ``Backend`` (a ``LocalRoute`` of it generates text), so a step fans out to the
N nodes with a deadline and comes back as one output; the nodes must agree on every logit's
crc32. When a node dies the others' exchanges fail as soon as its streams close, so every call
ends within the step deadline and the caller gets one structured error naming the lost node.
Every node is dialled over mutual TLS (``security``: the driver's own swarm identity, a gateway's
or an admin's), pinned to the name only worker certificates carry; None dials plaintext.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future

import grpc

from meshnet.core.errors import EngineError, InvalidArgument, MeshnetError, Unavailable
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import ShardShape, StepInput, StepOutput
from meshnet.membership.channel import RenewingBlockingChannel
from meshnet.moe import wire as expert_wire
from meshnet.wire.status import error_from_rpc
from meshnet.wire.tls import ANY_WORKER_NAME, LinkSecurity

PROBE_INTERVAL_S = 0.5
"""How long a step may run before the driver starts asking its pending nodes whether they live."""
PROBE_TIMEOUT_S = 1.0
"""A live node answers a liveness probe within this, even while its engine runs a long step."""


class ExpertGroupClient:
    def __init__(
        self, addresses: Sequence[str], step_timeout_s: float = 30.0, *, security: LinkSecurity | None = None
    ) -> None:
        if not addresses:
            raise InvalidArgument("an expert group needs at least one node address")
        self._addresses = list(addresses)
        self._timeout_s = step_timeout_s
        options = expert_wire.CHANNEL_OPTIONS
        self._channels = [RenewingBlockingChannel(a, security, ANY_WORKER_NAME, options) for a in self._addresses]
        self.nodes = [self._describe(i) for i in range(len(self._stubs))]
        self._check_group()
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

    @property
    def _stubs(self) -> list[expert_wire.ExpertGroupStub]:
        """Stubs over each node's channel of the current certificate (``RenewingBlockingChannel``)."""
        return [channel.stub(expert_wire.ExpertGroupStub) for channel in self._channels]

    def _describe(self, index: int) -> expert_wire.ExpertNodeDescription:
        try:
            reply = self._stubs[index].DescribeExpertNode(expert_wire.ExpertNodeQuery(), timeout=self._timeout_s)
        except grpc.RpcError as error:
            raise Unavailable(f"expert node at {self._addresses[index]}: {error_from_rpc(error).message}") from None
        return expert_wire.node_info_from_proto(reply)

    def describe(self) -> list[expert_wire.ExpertNodeDescription]:
        """Every node's description now (its exchange counters included)."""
        return [self._describe(i) for i in range(len(self._stubs))]

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
        calls: list[Future[expert_wire.ExpertStepReply]] = [
            stub.ExpertStep.future(request, timeout=self._timeout_s) for stub in self._stubs
        ]
        self._await_or_probe(calls)
        replies, failures = [], []
        for index, call in enumerate(calls):
            try:
                replies.append(expert_wire.outputs_from_proto(call.result(), request.step, self._shape.n_vocab))
            except grpc.RpcError as error:
                failures.append((index, error_from_rpc(error)))
            except MeshnetError as error:
                failures.append((index, error))
        if failures:
            raise _group_error(failures, self._addresses)
        for other in replies[1:]:
            if [r.crc32 for r in other] != [r.crc32 for r in replies[0]]:
                raise EngineError("the nodes of the expert group returned different logits")
        return [StepOutput(r.slot, logits=r.logits) for r in replies[0]]

    def _await_or_probe(self, calls: list[Future[expert_wire.ExpertStepReply]]) -> None:
        """Wait for every node's reply; while one is pending, ask it every PROBE_INTERVAL_S whether
        it is alive. A node that does not answer within PROBE_TIMEOUT_S (frozen, partitioned: its
        sockets stay open, so no stream closes and HTTP/2 keepalive did not notice, measured) ends
        the step with ``Unavailable`` naming it, PROBE_INTERVAL_S + PROBE_TIMEOUT_S after it stopped
        answering at most, not at the step deadline. A node busy with a long step still answers:
        the probe is served by the gRPC threads, not the engine thread."""
        changed = threading.Event()
        for call in calls:
            call.add_done_callback(lambda _call: changed.set())
        while not all(call.done() for call in calls):
            if changed.wait(PROBE_INTERVAL_S):
                changed.clear()
                continue
            for index, call in enumerate(calls):
                if call.done():
                    continue
                try:
                    self._stubs[index].DescribeExpertNode(expert_wire.ExpertNodeQuery(), timeout=PROBE_TIMEOUT_S)
                except grpc.RpcError as error:
                    for other in calls:
                        other.cancel()
                    raise Unavailable(
                        f"expert group node {index} ({self._addresses[index]}) stopped answering during a step "
                        f"(liveness probe: {error_from_rpc(error).message})"
                    ) from None

    def truncate(self, slot: int, position: int) -> None:
        if position != 0:
            raise InvalidArgument("an expert group frees whole sessions only")
        for index, stub in enumerate(self._stubs):
            try:
                stub.ExpertRelease(expert_wire.ExpertReleaseRequest(slot=slot), timeout=self._timeout_s)
            except grpc.RpcError as error:
                raise _group_error([(index, error_from_rpc(error))], self._addresses) from None

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


def _group_error(failures: list[tuple[int, MeshnetError]], addresses: list[str]) -> MeshnetError:
    """One error for the caller: the node that could not be reached, else the first node's own."""
    unreachable = [i for i, error in failures if "lost" not in error.message and isinstance(error, Unavailable)]
    index, error = next(((i, e) for i, e in failures if i in unreachable), failures[0])
    return type(error)(f"expert group node {index} ({addresses[index]}): {error.message}")
