"""Helpers for tests of networked expert-parallel groups: a group under mTLS, the bitwise
comparison of a group with the whole model, and single calls on one node that report their status.

Identities are minted from a data dir's CA as ``meshnet up`` does (``deploy.up_moe``): every node
a worker certificate, listed to its peers by node id; another data dir is another swarm.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
import numpy as np

from meshnet.deploy.expert_launch import expert_group_specs
from meshnet.deploy.up_moe import minted_security, minted_worker_identity
from meshnet.engine.backend import Backend, StepInput
from meshnet.engine.bitwise import bit_identical
from meshnet.moe import wire as expert_wire
from meshnet.process.launcher import ChildProcess, launch_all
from meshnet.wire.tls import ANY_WORKER_NAME, LinkSecurity, blocking_channel


def launch_secure_group(
    root: Path, model: Path, size: int, options: Sequence[str]
) -> tuple[list[str], list[ChildProcess], LinkSecurity]:
    """Start ``size`` nodes with worker identities of ``root/data``'s swarm; their addresses, the
    processes (the caller stops them) and a gateway identity to drive them with."""
    data = root / "data"
    peers, specs = expert_group_specs(data, model, size, root, options, identity=minted_worker_identity(data))
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


def rows_call(address: str, security: LinkSecurity | None, sender: int, model_sha256: str) -> grpc.StatusCode:
    """Open ExchangeRows as node ``sender`` and read until the server ends the stream: its status."""
    channel = blocking_channel(address, security, ANY_WORKER_NAME, expert_wire.CHANNEL_OPTIONS)
    done = threading.Event()

    def frames() -> Iterator[expert_wire.ExpertRowsFrame]:
        yield expert_wire.ExpertRowsFrame(sender=sender, model_sha256=model_sha256)
        done.wait(CALL_TIMEOUT_S)  # keep our side open: the server's refusal must end the call

    try:
        for _ in expert_wire.ExpertGroupStub(channel).ExchangeRows(frames(), timeout=CALL_TIMEOUT_S):
            pass
    except grpc.RpcError as error:
        return error.code()  # type: ignore[no-any-return]
    finally:
        done.set()
        channel.close()
    return grpc.StatusCode.OK


def step_call(address: str, security: LinkSecurity | None, rpc: str) -> grpc.StatusCode:
    """One unary call (a step the nodes would refuse as out of order, or a describe): its status."""
    channel = blocking_channel(address, security, ANY_WORKER_NAME, expert_wire.CHANNEL_OPTIONS)
    stub = expert_wire.ExpertGroupStub(channel)
    try:
        if rpc == "ExpertStep":
            items = [expert_wire.ExpertStepItem(1, 0, np.array([5], np.int32), "last")]
            stub.ExpertStep(expert_wire.step_to_proto(10**6, items), timeout=CALL_TIMEOUT_S)
        else:
            stub.DescribeExpertNode(expert_wire.ExpertNodeQuery(), timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as error:
        return error.code()  # type: ignore[no-any-return]
    finally:
        channel.close()
    return grpc.StatusCode.OK
