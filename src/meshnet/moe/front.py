"""``meshnet worker --expert-group A0,...,AN-1``: an expert-parallel group served as one full shard.

The front is an ordinary worker (Shard service, tracker registration, heartbeats, drain) whose
engine is the group driver (``moe/group_client.py``) instead of a local llama.cpp
slice: every batch the engine loop runs fans out to the group's N nodes. So the tracker routes
to a group by coverage like any full-range worker, and the gateway serves it over the OpenAI
API with telemetry and work records, through the same code as any route.

The recipe is the one a layer-split worker of the same model and settings computes: a group's
output is bit-identical to whole-model llama.cpp (each node certifies that at start-up, and the
nodes must agree on every logit's crc32 each step), so routes, failover replays and audits may
mix groups and layer shards of one model. The front checks that its group serves the file it
hashed and computes with the numerics settings it was given (``--prefill-chunk``,
``--flash-attn``, ``--repack``: part of the recipe), which each node reports.

A group does not survive the loss of a node (``moe/node.py``): after a failed step the
front takes no more steps, and ``serve_worker`` stops, deregisters and exits with the group's
error, so whatever runs the group (``meshnet up``) re-forms it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from meshnet.core.errors import FailedPrecondition, InvalidArgument, MeshnetError, Unavailable
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import KeepsNoKv, ShardShape, StepInput, StepOutput
from meshnet.moe.config import ExpertFrontConfig
from meshnet.moe.group_client import ExpertGroupClient
from meshnet.moe.ownership import numerics_mismatch
from meshnet.session.admission import CapacityPlan
from meshnet.wire.tls import LinkSecurity

if TYPE_CHECKING:
    from meshnet.artifact.describe import ModelDescription

T = TypeVar("T")
GROUP_POLL_S = 0.5
"""How often a front waiting for its group asks the nodes again."""
GROUP_START_TIMEOUT_S = 180.0
"""How long a front waits for its group to form (its nodes certify and load first)."""
GROUP_STEP_TIMEOUT_S = 30.0
"""Deadline of one step on the group; a lost or frozen node ends a step long before it (the
driver's stream loss and liveness probe, ``moe/group_client.py``)."""


class ExpertGroupBackend(KeepsNoKv):
    """The ``Backend`` a front's engine loop owns: the group driver, cut to the front's chunk.

    Prompts are cut at the front's ``prefill_chunk`` (aligned to absolute positions, as every
    shard cuts them), so a long prompt advances one chunk per engine tick between other
    sessions' decode steps, and the chunking the recipe names is the one the nodes compute."""

    def __init__(self, group: ExpertGroupClient, prefill_chunk: int) -> None:
        self._group = group
        self._shape = replace(group.shape, max_batch_tokens=min(prefill_chunk, group.shape.n_ctx_per_slot))
        self.failure: MeshnetError | None = None
        """Why the group broke (None while it serves): set by the first failed step."""
        self.broken = threading.Event()

    @property
    def shape(self) -> ShardShape:
        return self._shape

    def run(self, batch: list[StepInput]) -> list[StepOutput]:
        if self.failure is not None:
            raise self.failure
        return self._guarded(lambda: self._group.run(batch))

    def truncate(self, slot: int, position: int) -> None:
        if self.failure is None:  # a broken group has nothing to free: its nodes refuse every call
            self._guarded(lambda: self._group.truncate(slot, position))

    def _guarded(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except InvalidArgument:
            raise  # bad input, refused as a whole (a session's error): the group itself is fine
        except MeshnetError as error:
            # Some nodes may have run the call and others not: the group cannot continue.
            self.failure = Unavailable(f"the expert group broke: {error.message}")
            self.broken.set()
            raise self.failure from None

    def close(self) -> None:
        self._group.close()


def connect_group(
    addresses: Sequence[str],
    model_sha256: str,
    timeout_s: float,
    step_timeout_s: float,
    security: LinkSecurity | None = None,
) -> ExpertGroupClient:
    """The driver of the group at ``addresses`` once every node is up and every peer stream is
    connected (a front may start with its nodes); refuses a group serving another model file."""
    deadline = time.monotonic() + timeout_s
    last: MeshnetError | None = None
    while True:
        try:
            group = ExpertGroupClient(addresses, step_timeout_s=step_timeout_s, security=security)
        except Unavailable as error:  # a node not listening yet, or a group broken at start
            last = error
        else:
            waiting = [n.index for n in group.nodes if n.peers_connected != n.group_size - 1]
            if not waiting:
                if group.nodes[0].model_sha256 != model_sha256:
                    group.close()
                    raise FailedPrecondition(
                        f"the expert group at {addresses[0]} serves model {group.nodes[0].model_sha256[:12]}…, "
                        f"not the --model this front hashed ({model_sha256[:12]}…)"
                    )
                return group
            group.close()
            last = Unavailable(f"expert group nodes {waiting} have not connected to every peer yet")
        if time.monotonic() >= deadline:
            raise Unavailable(f"the expert group at {','.join(addresses)} did not form in {timeout_s:g} s: {last}")
        time.sleep(GROUP_POLL_S)


def group_capacity(shape: ShardShape) -> CapacityPlan:
    """The front's sessions are the group's: its nodes hold the weights and the KV, not the front."""
    return CapacityPlan(shape.max_slots, 0, 0, 0, None)


def open_group_backend(
    config: ExpertFrontConfig, description: ModelDescription, model_sha256: str, security: LinkSecurity | None
) -> ExpertGroupBackend:
    """The front's engine: its group's driver, once the group has formed (runs on the engine thread).
    ``security``: the front's own worker identity, which the nodes' mTLS links take."""
    if config.layers != LayerRange(0, description.n_layers):
        raise InvalidArgument(f"--expert-group serves the whole model: --layers must be 0:{description.n_layers}")
    group = connect_group(config.nodes, model_sha256, GROUP_START_TIMEOUT_S, GROUP_STEP_TIMEOUT_S, security)
    if group.shape.n_layers != description.n_layers or group.shape.n_embd != description.n_embd:
        group.close()
        raise FailedPrecondition("the expert group's model shape differs from --model's")
    mismatch = numerics_mismatch(config.numerics, [(node.index, node.numerics) for node in group.nodes])
    if mismatch is not None:
        group.close()
        raise FailedPrecondition(mismatch)
    # A front starts with no sessions, so its nodes must hold none either: a front that exited
    # (killed alone) leaves its sessions' KV there, and a new session in that slot would append.
    for slot in range(group.shape.max_slots):
        group.truncate(slot, 0)
    return ExpertGroupBackend(group, config.numerics.prefill_chunk)
