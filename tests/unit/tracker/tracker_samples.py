"""Sample recipes, node records, node views and work records for the tracker tests.

Recipes, certifications and records come from ``meshnet.bench.sample_nodes``, which the
benchmarks that drive the tracker share: certifications there are written by hand, they are the
tracker's input, and what the tracker tests is its verdict on them. Real certifications are
produced by ``engine.certification`` (tests/unit/engine) and registered by real workers
(tests/integration).
"""

from __future__ import annotations

from dataclasses import replace

from meshnet.bench.sample_nodes import LOGITS_SHA256 as LOGITS_SHA256
from meshnet.bench.sample_nodes import SAMPLE_MODEL, SAMPLE_N_LAYERS, SAMPLE_RECIPE, node_record
from meshnet.bench.sample_nodes import capability as capability
from meshnet.bench.sample_nodes import certification as certification
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.recipe import Recipe
from meshnet.core.tracking import NodeWork, WorkRecord
from meshnet.tracker.route_costs import NodeView

N_LAYERS = SAMPLE_N_LAYERS
MODEL = SAMPLE_MODEL
RECIPE = SAMPLE_RECIPE
FINGERPRINT = RECIPE.fingerprint()
# Same model name, another recipe: chaining it with RECIPE would corrupt the hidden state.
OTHER_RECIPE = replace(RECIPE, weight_quantization="Q8_0")
OTHER_FINGERPRINT = OTHER_RECIPE.fingerprint()
# Eight layers, for property tests over every small swarm.
SMALL_RECIPE = replace(RECIPE, n_layers=8)
SMALL_OTHER_RECIPE = replace(OTHER_RECIPE, n_layers=8)

registration = node_record
"""The record a node of a sample recipe serving ``start:stop`` registers (model ``MODEL``)."""


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
