"""Start-up certification of expert parallelism: whole model versus an in-process group.

The mechanism rests on llama.cpp internals (tensor names in ``build_moe_ffn``, the order of its
nodes, that a write in the eval callback is read by later nodes, the kernels' per-expert row
lists). Before a node serves its share, a tiny synthetic MoE of the served family and weight
types runs whole and as a group of the served size (and of 2), prefill and greedy decode, two
sessions batched; unless every logit and every top-k choice is identical we refuse to serve.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.certification_models import certification_specs
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.errors import CertificationFailed, MeshnetError
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.engine.bitwise import bit_identical, describe_difference
from meshnet.engine.llama_config import LlamaConfig
from meshnet.moe.backend import ExpertParallelBackend, RoutingRecord
from meshnet.moe.group import ExpertGroup
from meshnet.moe.ownership import ExpertOwnership

CERTIFICATION_PROMPTS = ((1, 270, 281, 289, 262, 280, 7, 9, 33, 41, 270, 5), (1, 5, 266, 266, 271))
DECODE_STEPS = 6
_CONFIG = LlamaConfig(n_threads=1, max_slots=2, n_ctx_per_slot=128, max_batch_tokens=8)


def certify_expert_parallel(model: Path, group_size: int, config: LlamaConfig | None = None) -> tuple[str, ...]:
    """Raise ``CertificationFailed`` unless a group of ``group_size`` matches the whole model
    bitwise on this build, for the family and weight types of ``model``; returns the checks."""
    # The served threads, attention and repack settings: each picks kernel paths the group must agree on.
    served = config or _CONFIG
    config = replace(_CONFIG, flash_attn=served.flash_attn, n_threads=served.n_threads, repack=served.repack)
    try:
        specs = certification_specs(Path(model))
    except MeshnetError as error:
        raise CertificationFailed(f"cannot certify {Path(model).name} for expert parallelism: {error}") from error
    checks: list[str] = []
    for base in specs:
        # Enough experts for every node to find k it does not own; 16 also splits unevenly by 3.
        spec = replace(base, n_expert=max(16, 2 * group_size), n_expert_used=4, n_layers=3)
        for size in sorted({2, group_size}):
            checks.append(f"{spec.architecture} {spec.weight_type.name} {size} nodes: {_certify(spec, size, config)}")
    return tuple(checks)


def _certify(spec: SyntheticSpec, group_size: int, config: LlamaConfig) -> str:
    with tempfile.TemporaryDirectory(prefix="meshnet-certify-ep-") as raw:
        folder = Path(raw)
        source = write_synthetic_model(folder / "moe.gguf", spec)
        path = SliceCache(folder / "cache").shard_files(source, LayerRange(0, spec.n_layers), spec.n_layers).slice
        try:
            whole = ExpertParallelBackend(path, config, ExpertOwnership(0, 1))
            group = ExpertGroup.open(path, config, group_size)
        except MeshnetError as error:
            raise CertificationFailed(f"an expert-parallel group does not load on this build: {error}") from error
        try:
            return _compare(whole, group)
        except MeshnetError as error:
            raise CertificationFailed(f"expert-parallel group failed on a tiny model: {error}") from error
        finally:
            whole.close()
            group.close()


def _compare(whole: ExpertParallelBackend, group: ExpertGroup) -> str:
    batch = [
        StepInput(slot, 0, tokens=np.array(p, np.int32), want_logits="all")
        for slot, p in enumerate(CERTIFICATION_PROMPTS)
    ]
    positions = [len(p) for p in CERTIFICATION_PROMPTS]
    for step in range(DECODE_STEPS + 1):
        want_routing, got_routing = RoutingRecord(), RoutingRecord()
        whole.record_routing(want_routing)
        group.nodes[-1].record_routing(got_routing)
        want = whole.run(batch)
        got = group.run(batch)
        for expected, actual in zip(want, got, strict=True):
            _require(expected.logits, actual.logits, f"step {step}, session {expected.slot}")
        if [(layer, ids.tobytes()) for layer, ids in want_routing.selected] != [
            (layer, ids.tobytes()) for layer, ids in got_routing.selected
        ]:
            raise CertificationFailed(f"step {step}: the group's router chose other experts than the whole model")
        batch = [
            StepInput(o.slot, positions[o.slot] + step, tokens=np.array([int(np.argmax(o.logits[-1]))], np.int32))  # type: ignore[index]
            for o in want
        ]
    return f"prefill and {DECODE_STEPS} batched greedy steps of 2 sessions bit-identical, top-k identical"


def _require(expected: np.ndarray | None, actual: np.ndarray | None, what: str) -> None:
    if expected is None or actual is None or expected.shape != actual.shape:
        raise CertificationFailed(f"{what}: the expert group's output has the wrong shape")
    if not bit_identical(expected, actual):
        raise CertificationFailed(
            f"{what}: the expert group differs from the whole model ({describe_difference(expected, actual)}); "
            "this llama.cpp build breaks the expert-parallel mechanism's assumptions, refusing to serve"
        )
