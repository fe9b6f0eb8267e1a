"""Sample recipes, registrations, node views and work records for the tracker tests."""

from __future__ import annotations

from dataclasses import replace

from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.recipe import Recipe
from meshnet.core.tracking import HardwareSummary, NodeRegistration, NodeWork, WorkRecord
from meshnet.tracker.routing import NodeView

N_LAYERS = 20
MODEL = "tiny-llama"

RECIPE = Recipe(
    model_sha256="00" * 32,
    architecture="llama",
    adapter_version="1",
    weight_quantization="Q4_1",
    activation_dtype="f32",
    kv_dtype="f16",
    backend="llama-cpp-python",
    backend_version="0.3.36",
    n_layers=N_LAYERS,
    n_embd=64,
)
FINGERPRINT = RECIPE.fingerprint()
# Same model name, another recipe: chaining it with RECIPE would corrupt the hidden state.
OTHER_RECIPE = replace(RECIPE, weight_quantization="Q8_0")
OTHER_FINGERPRINT = OTHER_RECIPE.fingerprint()


def registration(
    start: int,
    stop: int,
    *,
    address: str = "127.0.0.1:9000",
    decode_tokens_per_s: float = 100.0,
    certified: bool = True,
    recipe: Recipe = RECIPE,
    max_sessions: int = 8,
) -> NodeRegistration:
    return NodeRegistration(
        address=address,
        recipe=recipe,
        fingerprint=recipe.fingerprint(),
        model=MODEL,
        quantization=recipe.weight_quantization,
        layers=LayerRange(start, stop),
        hardware=HardwareSummary(cpu_count=2, memory_bytes=4 << 30),
        max_sessions=max_sessions,
        prefill_tokens_per_s=10 * decode_tokens_per_s,
        decode_tokens_per_s=decode_tokens_per_s,
        certified=certified,
    )


def view(
    node_id: str,
    start: int,
    stop: int,
    *,
    rate: float = 100.0,
    fingerprint: str = FINGERPRINT,
    certified: bool = True,
    free_sessions: int = 4,
    queue_depth: int = 0,
    n_layers: int = N_LAYERS,
) -> NodeView:
    return NodeView(
        node_id=NodeId(node_id),
        address=f"{node_id}.local:9000",
        model=MODEL,
        quantization="Q4_1" if fingerprint == FINGERPRINT else "Q8_0",
        fingerprint=fingerprint,
        n_layers=n_layers,
        layers=LayerRange(start, stop),
        certified=certified,
        decode_tokens_per_s=rate,
        free_sessions=free_sessions,
        queue_depth=queue_depth,
    )


def work_record(request_id: str = "req-1", *, tokens_out: int = 32) -> WorkRecord:
    return WorkRecord(
        request_id=RequestId(request_id),
        session_id=SessionId("s-1"),
        model=MODEL,
        status="completed",
        tokens_in=12,
        tokens_out=tokens_out,
        attribution=(
            NodeWork(NodeId("n-a"), LayerRange(0, 10), 12 + tokens_out),
            NodeWork(NodeId("n-b"), LayerRange(10, 20), 12 + tokens_out),
        ),
        billing_units=0.5,
        started_at=1_700_000_000.0,
        finished_at=1_700_000_002.5,
    )
