"""How far a device's numbers drift from the CPU's, measured on the synthetic model.

Certification proves a device's splits equal its own whole model bit for bit. A route that
chains two device classes cannot be exact: each device's kernels round differently. Before the
tracker may plan such a route (only where the swarm opted in), a GPU worker measures what one
computes: the CPU's whole model against the two mixed splits its own machine can run (CPU head
with the device's tail, and the device's head with a CPU tail), fed the same tokens, over
prefill and greedy decode. The worst of those is the node's ``DeviceDrift``; a route of several
devices is labelled with the bound its nodes' drifts give (``core.devices.route_drift``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.certification_models import DEFAULT_SPEC, certification_cut
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import write_synthetic_model
from meshnet.core.devices import CPU, DeviceDrift, DeviceInfo
from meshnet.core.errors import CertificationFailed, InvalidArgument, MeshnetError
from meshnet.core.layers import LayerRange
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard

PROMPT = (1, 270, 281, 289, 262, 280, 7, 9)
DECODE_STEPS = 8


def measure_device_drift(device: DeviceInfo, *, repack: bool = True) -> DeviceDrift:
    """``device``'s drift from the CPU on the default synthetic model, as its mixed splits show."""
    if not device.is_gpu:
        raise InvalidArgument("the CPU is the reference: only a GPU's drift is measured")
    spec = DEFAULT_SPEC
    cpu, gpu = (_config(d, repack) for d in (CPU, device))
    with tempfile.TemporaryDirectory(prefix="meshnet-drift-") as raw:
        folder = Path(raw)
        source = describe_model(write_synthetic_model(folder / "tiny.gguf", spec))
        cache = SliceCache(folder / "cache")
        head, tail = (
            LayerRange(0, certification_cut(spec)[0].stop),
            LayerRange(certification_cut(spec)[0].stop, spec.n_layers),
        )
        try:
            routes = [
                LocalRoute([open_llama_shard(source, LayerRange(0, spec.n_layers), cache, cpu)]),
                LocalRoute([open_llama_shard(source, head, cache, cpu), open_llama_shard(source, tail, cache, gpu)]),
                LocalRoute([open_llama_shard(source, head, cache, gpu), open_llama_shard(source, tail, cache, cpu)]),
            ]
        except MeshnetError as error:
            raise CertificationFailed(f"mixed {device} and CPU splits do not load on this build: {error}") from error
        try:
            return _compare(routes[0], routes[1:])
        finally:
            for route in routes:
                route.close()


def _config(device: DeviceInfo, repack: bool) -> LlamaConfig:
    return LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=64, max_batch_tokens=64, repack=repack, device=device)


def _compare(reference: LocalRoute, mixed: list[LocalRoute]) -> DeviceDrift:
    """Teacher-forced: every route gets the reference's greedy tokens, so rows stay comparable."""
    tokens = np.array(PROMPT, np.int32)
    expected = [reference.forward(0, 0, tokens, "all")]
    actual = [[route.forward(0, 0, tokens, "all")] for route in mixed]
    for step in range(DECODE_STEPS):
        token = np.array([int(np.argmax(expected[-1][-1]))], np.int32)
        expected.append(reference.forward(0, len(PROMPT) + step, token))
        for rows, route in zip(actual, mixed, strict=True):
            rows.append(route.forward(0, len(PROMPT) + step, token))
    want = np.concatenate(expected)
    agree, worst = 1.0, 0.0
    for rows in actual:
        got = np.concatenate(rows)
        agree = min(agree, float(np.mean(np.argmax(got, axis=1) == np.argmax(want, axis=1))))
        worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want))))
    if not np.isfinite(worst):
        raise CertificationFailed("a mixed split produced NaN or infinite logits")
    return DeviceDrift(top1_agreement=agree, max_abs_logit_diff=worst, positions=len(want))
