"""Sample node records of one small llama recipe: what a node registers with the tracker.

Benchmarks that drive the tracker in process (``scripts/bench_route_planning.py``,
``scripts/bench_etcd_store.py``) and the tracker's tests (``tests/unit/tracker/tracker_samples.py``)
build their swarms from these, so a change to what a record carries is made once. Scripts cannot
import the tests, hence this home.

Certifications here are written by hand (``certification``): they are the tracker's input, and
what the tracker tests is its verdict on them. Real certifications are produced by
``engine.certification`` and registered by real workers.
"""

from __future__ import annotations

from dataclasses import replace

from meshnet.core.layers import LayerRange
from meshnet.core.node_record import Certification, HardwareSummary, NodeCapability, NodeRecord
from meshnet.core.recipe import Recipe

SAMPLE_MODEL = "tiny-llama"
SAMPLE_N_LAYERS = 20
SAMPLE_RECIPE = Recipe(
    model_sha256="00" * 32,
    architecture="llama",
    adapter_version="1",
    weight_quantization="Q4_1",
    activation_dtype="f32",
    kv_dtype="f16",
    backend="llama-cpp-python",
    backend_version="0.3.36",
    n_layers=SAMPLE_N_LAYERS,
    n_embd=64,
)

LOGITS_SHA256 = "ab" * 32
"""The whole-model digest every honest node of a sample recipe presents."""
CERTIFIED_CHECKS = ("prompt 0: prefill and 6 greedy steps bit-identical",)


def sample_recipe(n_layers: int) -> Recipe:
    """``SAMPLE_RECIPE`` with ``n_layers`` layers (another model, for the tracker)."""
    return replace(SAMPLE_RECIPE, n_layers=n_layers)


def certification(
    recipe: Recipe = SAMPLE_RECIPE,
    *,
    whole: str = LOGITS_SHA256,
    split: str | None = None,
    checks: tuple[str, ...] = CERTIFIED_CHECKS,
) -> Certification:
    """A report certifying ``recipe`` (split logits equal to whole unless ``split`` says otherwise)."""
    return Certification.seal(recipe.fingerprint(), recipe.backend_version, checks, whole, split or whole)


def capability(
    *,
    context: int = 2048,
    max_sessions: int = 8,
    decode_tokens_per_s: float = 100.0,
    n_embd: int = SAMPLE_RECIPE.n_embd,
) -> NodeCapability:
    """A CPU node's capability; it claims to prefill ten times as fast as it decodes."""
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


def node_record(
    start: int,
    stop: int,
    *,
    address: str = "127.0.0.1:9000",
    decode_tokens_per_s: float = 100.0,
    recipe: Recipe = SAMPLE_RECIPE,
    model: str = SAMPLE_MODEL,
    max_sessions: int = 8,
    context: int = 2048,
    report: Certification | None = None,
) -> NodeRecord:
    """The record a node of ``recipe`` serving ``start:stop`` registers (certified by ``report``,
    or by ``certification(recipe)``)."""
    return NodeRecord(
        address=address,
        recipe=recipe,
        fingerprint=recipe.fingerprint(),
        model=model,
        quantization=recipe.weight_quantization,
        layers=LayerRange(start, stop),
        hardware=HardwareSummary(cpu_count=2, memory_bytes=4 << 30),
        capability=capability(
            context=context, max_sessions=max_sessions, decode_tokens_per_s=decode_tokens_per_s, n_embd=recipe.n_embd
        ),
        certification=report or certification(recipe),
    )
