"""One node's record: what it serves, what a request through it must respect, and the evidence
that its engine splits bit-identically.

A worker builds its record once, at start-up, and registers it. The tracker keeps it as the
node's entry and builds everything else from it: the planner's view (``tracker.routing``), the
status table (``core.swarm_status.NodeStatus``) and every hop of every route it hands out
(``core.events.RouteHop`` carries the node's ``NodeCapability``), so a route client sizes its
frames for each hop from the route itself and never asks a node on a request's path. This is
Petals' ``ServerInfo``: one value per server, read by routing and by the health monitor alike.

Ids are not part of the record: the tracker names a node when it registers (with its
certificate's id on a secured swarm), so the record is what a node says about itself and the
id is what the swarm calls it. Values arrive off the wire, so every constructor validates.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from meshnet.core.checks import (
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_SESSIONS,
    check_count,
    check_finite,
    check_text,
)
from meshnet.core.devices import DEVICE_KINDS, MAX_DEVICE_BYTES, DeviceDrift, DeviceKind
from meshnet.core.errors import InvalidArgument
from meshnet.core.features import NODE_FEATURES, check_features
from meshnet.core.layers import LayerRange
from meshnet.core.recipe import Recipe

Device = DeviceKind
"""Where a node computes (``core.devices``): its device class is in its recipe too."""
DEVICES: tuple[Device, ...] = DEVICE_KINDS
MAX_EXPERT_GROUP_NODES = 256
"""Nodes one expert-parallel group's front may name (a group is at most one node per expert)."""
MAX_CHECKS = 256
"""Checks one certification report may list."""
MAX_FRAME_BYTES_LIMIT = 2**31 - 1
"""gRPC's own message limit: no node can accept a larger frame."""
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class HardwareSummary:
    cpu_count: int
    memory_bytes: int

    def __post_init__(self) -> None:
        check_count("cpu_count", self.cpu_count, 1 << 16)
        check_count("memory_bytes", self.memory_bytes, 1 << 60)


@dataclass(frozen=True)
class NodeCapability:
    """What a request routed through one node must respect, and how fast the node measured itself.

    This is the part of the record every route hop carries: the route client reads the context
    check and the prefill chunking from it."""

    n_ctx_per_session: int
    """Positions one session holds on this node: a prompt plus its generated tokens must fit."""
    prefill_chunk_tokens: int
    """Tokens per engine call of a prefill: a sender that cuts a prompt into frames of this many
    lets the route pipeline them, with the numerics of one big frame."""
    max_tokens_per_frame: int
    max_frame_bytes: int
    """Largest serialized frame the node accepts (its transport's receive limit)."""
    n_embd: int
    """Width of the hidden state at the node's seams: a frame row costs ``4 * n_embd`` bytes."""
    max_sessions: int
    device: Device = "cpu"
    prefill_tokens_per_s: float = 0.0
    """Measured over the node's own layer range; 0 means not measured."""
    decode_tokens_per_s: float = 0.0
    """Measured over the node's own layer range, one sequence; 0 means not measured."""
    device_name: str = ""
    """A GPU node's device model as its driver names it; empty on the CPU."""
    device_memory_total: int = 0
    device_memory_free: int = 0
    """A GPU node's device memory once its engine loaded (weights, KV and compute buffers in)."""
    drift: DeviceDrift | None = None
    """A GPU node's measured drift from the CPU (``engine.device_drift``); a mixed-device route
    may include only nodes that carry one."""
    prefix_cache_bytes: int = 0
    """Prompt KV the node keeps for reuse (``session.kv_store``); 0: none, so a route through it
    reuses no prompt and warming a turn's answer on it is wasted (``route.warmup``)."""
    features: tuple[str, ...] = NODE_FEATURES
    """What the node serves beyond the base protocol (``core.features``: as a tail, and ring
    batches), sorted: all of this build's. A node built before a feature existed lists none of it (its record on the
    wire has no such field), and is routed no request that needs it."""

    def __post_init__(self) -> None:
        check_count("n_ctx_per_session", self.n_ctx_per_session, MAX_POSITIONS, low=1)
        check_count("prefill_chunk_tokens", self.prefill_chunk_tokens, MAX_POSITIONS, low=1)
        check_count("max_tokens_per_frame", self.max_tokens_per_frame, MAX_POSITIONS, low=1)
        check_count("max_frame_bytes", self.max_frame_bytes, MAX_FRAME_BYTES_LIMIT, low=1)
        check_count("n_embd", self.n_embd, 1 << 20, low=1)
        check_count("max_sessions", self.max_sessions, MAX_SESSIONS, low=1)
        if self.device not in DEVICES:
            raise InvalidArgument(f"device must be one of {DEVICES}, got {self.device!r}")
        check_finite("prefill_tokens_per_s", self.prefill_tokens_per_s)
        check_finite("decode_tokens_per_s", self.decode_tokens_per_s)
        check_text("device_name", self.device_name, allow_empty=True)
        check_count("device_memory_total", self.device_memory_total, MAX_DEVICE_BYTES)
        check_count("device_memory_free", self.device_memory_free, self.device_memory_total)
        check_count("prefix_cache_bytes", self.prefix_cache_bytes, MAX_DEVICE_BYTES)
        check_features(self.features)


@dataclass(frozen=True)
class Certification:
    """What a node's start-up certification compared, bound to the recipe the node serves.

    The worker runs tiny synthetic models of its recipe's family and weight types whole and
    split (``engine.certification``) and hashes every logit each side produced; the tracker
    recomputes the verdict from these fields (``tracker.certification``) and refuses a node
    whose report does not certify the recipe it registers.

    What it proves, and what not: the models and the pinned build are deterministic, so every
    honest node of a recipe presents the same ``whole_sha256``. A node whose build computes
    other numbers (another llama.cpp, another kernel path) presents another one and is refused
    before it can break bit-identity silently. A node that lies can copy a digest without
    computing it; catching it at serve time is the audit's job (``route.audit``).
    """

    fingerprint: str
    """The recipe certified: the node's own, whose family, weight types and backend settings
    chose the synthetic models and the kernels."""
    backend_version: str
    checks: tuple[str, ...]
    """What was compared, in words (prefill, greedy decode, batched, isolation)."""
    whole_sha256: str
    """sha256 of every logit the whole synthetic models produced, float32 bytes, in order."""
    split_sha256: str
    """The same over the split routes' logits: equal to ``whole_sha256`` exactly when every
    compared logit was bitwise identical."""
    digest: str
    """``report_digest`` of the fields above, as the node computed it."""

    def __post_init__(self) -> None:
        check_text("certification fingerprint", self.fingerprint)
        check_text("certification backend_version", self.backend_version)
        check_count("certification checks", len(self.checks), MAX_CHECKS)
        for check in self.checks:
            check_text("certification check", check)
        for name, value in (("whole", self.whole_sha256), ("split", self.split_sha256), ("digest", self.digest)):
            if not isinstance(value, str) or not _SHA256.fullmatch(value):
                raise InvalidArgument(f"certification {name} must be a sha256 in lowercase hex, got {value!r:.80}")

    @classmethod
    def seal(
        cls, fingerprint: str, backend_version: str, checks: tuple[str, ...], whole_sha256: str, split_sha256: str
    ) -> Certification:
        """The report of these findings, with its digest."""
        digest = report_digest(fingerprint, backend_version, checks, whole_sha256, split_sha256)
        return cls(fingerprint, backend_version, checks, whole_sha256, split_sha256, digest)

    @property
    def recomputed_digest(self) -> str:
        return report_digest(self.fingerprint, self.backend_version, self.checks, self.whole_sha256, self.split_sha256)


def report_digest(
    fingerprint: str, backend_version: str, checks: tuple[str, ...], whole_sha256: str, split_sha256: str
) -> str:
    """sha256 of a report's findings in one canonical form, so both ends compute the same."""
    canonical = json.dumps(
        {
            "fingerprint": fingerprint,
            "backend_version": backend_version,
            "checks": list(checks),
            "whole_sha256": whole_sha256,
            "split_sha256": split_sha256,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class NodeRecord:
    """Everything a node says about itself when it joins: identity, capability, certification."""

    address: str
    """host:port the shard serves on."""
    recipe: Recipe
    fingerprint: str
    """``recipe.fingerprint()``; checked on construction so a worker and tracker never disagree."""
    model: str
    quantization: str
    layers: LayerRange
    hardware: HardwareSummary
    capability: NodeCapability
    certification: Certification
    expert_group: tuple[str, ...] = ()
    """A front of an expert-parallel group: the group's node addresses in index order (they
    compute what this full-range node serves; its work records name them through this). Empty
    for a worker that computes its own layers."""

    def __post_init__(self) -> None:
        check_text("address", self.address)
        check_text("model", self.model)
        check_text("quantization", self.quantization, allow_empty=True)
        check_count("n_layers", self.recipe.n_layers, MAX_LAYERS)
        if self.fingerprint != self.recipe.fingerprint():
            raise InvalidArgument(
                f"fingerprint {self.fingerprint!r} does not match the recipe's "
                f"{self.recipe.fingerprint()!r}: the worker and tracker disagree on the recipe"
            )
        self.layers.check_within(self.recipe.n_layers)
        if self.capability.n_embd != self.recipe.n_embd:
            raise InvalidArgument(
                f"capability n_embd {self.capability.n_embd} differs from the recipe's {self.recipe.n_embd}"
            )
        check_count("expert group nodes", len(self.expert_group), MAX_EXPERT_GROUP_NODES)
        for node in self.expert_group:
            check_text("expert group node", node)
        if self.expert_group and self.layers != LayerRange(0, self.recipe.n_layers):
            raise InvalidArgument(f"an expert group's front serves every layer, not {self.layers}")

    @property
    def n_layers(self) -> int:
        return self.recipe.n_layers
