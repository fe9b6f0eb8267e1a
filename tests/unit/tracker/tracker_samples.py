"""Sample recipes, node records, node views and work records for the tracker tests.

Certifications here are written by hand (``certification``): they are the tracker's input, and
what the tracker tests is its verdict on them. Real certifications are produced by
``engine.certification`` (tests/unit/engine) and registered by real workers (tests/integration).
"""

from __future__ import annotations

from dataclasses import replace

from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import Certification, HardwareSummary, NodeCapability, NodeRecord
from meshnet.core.recipe import Recipe
from meshnet.core.tracking import NodeWork, WorkRecord
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
# Eight layers, for property tests over every small swarm.
SMALL_RECIPE = replace(RECIPE, n_layers=8)
SMALL_OTHER_RECIPE = replace(OTHER_RECIPE, n_layers=8)


LOGITS_SHA256 = "ab" * 32
"""The whole-model digest every honest node of a sample recipe presents."""


def certification(recipe: Recipe = RECIPE, *, whole: str = LOGITS_SHA256, split: str | None = None) -> Certification:
    """A report certifying ``recipe`` (split logits equal to whole unless ``split`` says otherwise)."""
    checks = ("prompt 0: prefill and 6 greedy steps bit-identical",)
    return Certification.seal(recipe.fingerprint(), recipe.backend_version, checks, whole, split or whole)


def capability(
    *, context: int = 2048, max_sessions: int = 8, decode_tokens_per_s: float = 100.0, n_embd: int = RECIPE.n_embd
) -> NodeCapability:
    return NodeCapability(
        n_ctx_per_session=context,
        prefill_chunk_tokens=256,
        max_tokens_per_frame=context,
        max_frame_bytes=4 << 20,
        n_embd=n_embd,
        max_sessions=max_sessions,
        device="cpu",
        prefill_tokens_per_s=10 * decode_tokens_per_s,
        decode_tokens_per_s=decode_tokens_per_s,
    )


def registration(
    start: int,
    stop: int,
    *,
    address: str = "127.0.0.1:9000",
    decode_tokens_per_s: float = 100.0,
    recipe: Recipe = RECIPE,
    max_sessions: int = 8,
    context: int = 2048,
    report: Certification | None = None,
) -> NodeRecord:
    """The record a node of ``recipe`` serving ``start:stop`` registers."""
    return NodeRecord(
        address=address,
        recipe=recipe,
        fingerprint=recipe.fingerprint(),
        model=MODEL,
        quantization=recipe.weight_quantization,
        layers=LayerRange(start, stop),
        hardware=HardwareSummary(cpu_count=2, memory_bytes=4 << 30),
        capability=capability(
            context=context, max_sessions=max_sessions, decode_tokens_per_s=decode_tokens_per_s, n_embd=recipe.n_embd
        ),
        certification=report or certification(recipe),
    )


def view(
    node_id: str,
    start: int,
    stop: int,
    *,
    rate: float = 100.0,
    recipe: Recipe = RECIPE,
    free_sessions: int = 4,
    queue_depth: int = 0,
) -> NodeView:
    record = registration(start, stop, address=f"{node_id}.local:9000", decode_tokens_per_s=rate, recipe=recipe)
    return NodeView(
        node_id=NodeId(node_id),
        record=record,
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


class FakeClock:
    """The tracker's monotonic clock, moved only by the test (``now``)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
