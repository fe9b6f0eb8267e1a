"""node.proto messages <-> ``meshnet.core.node_record`` values: the one conversion of a node's record.

The tracker's Register, its route hops, its status table and a shard's GetCapability all carry
(parts of) the same record, so they all read and write it here. A decoded value is a validated
one: a missing part, an oversized list or an out-of-range number is ``InvalidArgument``, raised
by the core value's own checks before anyone acts on it.
"""

from __future__ import annotations

from typing import cast

from meshnet.core.checks import MAX_LAYERS, check_count, check_text
from meshnet.core.devices import DeviceDrift
from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import (
    MAX_CHECKS,
    MAX_EXPERT_GROUP_NODES,
    Certification,
    Device,
    HardwareSummary,
    NodeCapability,
    NodeRecord,
)
from meshnet.core.recipe import Recipe
from meshnet.wire.generated import node_pb2 as pb


def recipe_to_proto(recipe: Recipe) -> pb.Recipe:
    return pb.Recipe(
        model_sha256=recipe.model_sha256,
        architecture=recipe.architecture,
        adapter_version=recipe.adapter_version,
        weight_quantization=recipe.weight_quantization,
        activation_dtype=recipe.activation_dtype,
        kv_dtype=recipe.kv_dtype,
        backend=recipe.backend,
        backend_version=recipe.backend_version,
        n_layers=recipe.n_layers,
        n_embd=recipe.n_embd,
        boundary_schema=recipe.boundary_schema,
        device_class=recipe.device_class,
    )


def recipe_from_proto(message: pb.Recipe) -> Recipe:
    texts = {
        "model_sha256": message.model_sha256,
        "architecture": message.architecture,
        "adapter_version": message.adapter_version,
        "weight_quantization": message.weight_quantization,
        "activation_dtype": message.activation_dtype,
        "kv_dtype": message.kv_dtype,
        "backend": message.backend,
        "backend_version": message.backend_version,
        "boundary_schema": message.boundary_schema,
    }
    for name, value in texts.items():
        check_text(f"recipe.{name}", value)
    check_count("recipe.n_layers", message.n_layers, MAX_LAYERS, low=1)
    check_count("recipe.n_embd", message.n_embd, 1 << 20)
    check_text("recipe.device_class", message.device_class, allow_empty=True)
    return Recipe(n_layers=message.n_layers, n_embd=message.n_embd, device_class=message.device_class, **texts)


def capability_to_proto(capability: NodeCapability) -> pb.NodeCapability:
    return pb.NodeCapability(
        n_ctx_per_session=capability.n_ctx_per_session,
        prefill_chunk_tokens=capability.prefill_chunk_tokens,
        max_tokens_per_frame=capability.max_tokens_per_frame,
        max_frame_bytes=capability.max_frame_bytes,
        n_embd=capability.n_embd,
        max_sessions=capability.max_sessions,
        device=capability.device,
        prefill_tokens_per_s=capability.prefill_tokens_per_s,
        decode_tokens_per_s=capability.decode_tokens_per_s,
        device_name=capability.device_name,
        device_memory_total=capability.device_memory_total,
        device_memory_free=capability.device_memory_free,
        drift=None if capability.drift is None else _drift_to_proto(capability.drift),
        prefix_cache_bytes=capability.prefix_cache_bytes,
        features=capability.features,
    )


def _drift_to_proto(drift: DeviceDrift) -> pb.DeviceDrift:
    return pb.DeviceDrift(
        top1_agreement=drift.top1_agreement, max_abs_logit_diff=drift.max_abs_logit_diff, positions=drift.positions
    )


def capability_from_proto(message: pb.NodeCapability) -> NodeCapability:
    check_text("device", message.device)
    check_text("device_name", message.device_name, allow_empty=True)
    return NodeCapability(
        n_ctx_per_session=message.n_ctx_per_session,
        prefill_chunk_tokens=message.prefill_chunk_tokens,
        max_tokens_per_frame=message.max_tokens_per_frame,
        max_frame_bytes=message.max_frame_bytes,
        n_embd=message.n_embd,
        max_sessions=message.max_sessions,
        device=cast(Device, message.device),  # checked against DEVICES by NodeCapability
        prefill_tokens_per_s=message.prefill_tokens_per_s,
        decode_tokens_per_s=message.decode_tokens_per_s,
        device_name=message.device_name,
        device_memory_total=message.device_memory_total,
        device_memory_free=message.device_memory_free,
        drift=(
            DeviceDrift(message.drift.top1_agreement, message.drift.max_abs_logit_diff, message.drift.positions)
            if message.HasField("drift")
            else None
        ),
        prefix_cache_bytes=message.prefix_cache_bytes,
        features=tuple(sorted(set(message.features))),
    )


def certification_to_proto(report: Certification) -> pb.Certification:
    return pb.Certification(
        fingerprint=report.fingerprint,
        backend_version=report.backend_version,
        checks=report.checks,
        whole_sha256=report.whole_sha256,
        split_sha256=report.split_sha256,
        digest=report.digest,
    )


def certification_from_proto(message: pb.Certification) -> Certification:
    return Certification(
        fingerprint=message.fingerprint,
        backend_version=message.backend_version,
        # One past the limit, so an oversized list is refused by the report rather than cut short.
        checks=tuple(message.checks[: MAX_CHECKS + 1]),
        whole_sha256=message.whole_sha256,
        split_sha256=message.split_sha256,
        digest=message.digest,
    )


def record_to_proto(record: NodeRecord) -> pb.NodeRecord:
    return pb.NodeRecord(
        address=record.address,
        recipe=recipe_to_proto(record.recipe),
        fingerprint=record.fingerprint,
        model=record.model,
        quantization=record.quantization,
        layer_start=record.layers.start,
        layer_stop=record.layers.stop,
        hardware=pb.Hardware(cpu_count=record.hardware.cpu_count, memory_bytes=record.hardware.memory_bytes),
        capability=capability_to_proto(record.capability),
        certification=certification_to_proto(record.certification),
        expert_group_nodes=record.expert_group,
    )


def record_from_proto(message: pb.NodeRecord) -> NodeRecord:
    for part in ("recipe", "hardware", "capability", "certification"):
        if not message.HasField(part):
            raise InvalidArgument(f"the node record has no {part}")
    return NodeRecord(
        address=message.address,
        recipe=recipe_from_proto(message.recipe),
        fingerprint=message.fingerprint,
        model=message.model,
        quantization=message.quantization,
        layers=LayerRange(message.layer_start, message.layer_stop),
        hardware=HardwareSummary(message.hardware.cpu_count, message.hardware.memory_bytes),
        capability=capability_from_proto(message.capability),
        certification=certification_from_proto(message.certification),
        expert_group=tuple(message.expert_group_nodes[: MAX_EXPERT_GROUP_NODES + 1]),
    )
