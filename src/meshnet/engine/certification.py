"""Start-up certification: prove the pinned llama.cpp still behaves as the split engine assumes.

The tensor name ``l_out-N``, embedding input, vocab-less loading, last-layer row pruning and
the eval-callback protocol are llama.cpp internals. Before a backend serves, a tiny synthetic
model is run whole and split (head with NumPy embedding lookup, middle, tail), prefill and
greedy decode, solo and batched; unless every logit is bit-identical we refuse to serve.
Given the model it is about to serve, a worker certifies that model's family and each weight
type it uses (``artifact.certification_models``), so a recipe no check covered is never served.

Every logit compared is hashed on each side (``LogitDigests``): the report's whole and split
digests are equal exactly when every comparison was bitwise equal, and, the models and the build
being deterministic, every node of a recipe presents the same whole digest. A worker registers
the report bound to its recipe (``CertificationReport.bound_to``); the tracker checks it
(``tracker.certification``). A fake worker certifies its fake engine the same way.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.certification_models import DEFAULT_SPEC, certification_cut, certification_specs
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.devices import CPU, DeviceInfo
from meshnet.core.errors import CertificationFailed, MeshnetError
from meshnet.core.kv_type import KvType
from meshnet.core.layers import LayerRange, split_evenly
from meshnet.core.node_record import Certification
from meshnet.engine.backend import StepInput
from meshnet.engine.bitwise import bit_identical, describe_difference
from meshnet.engine.fake_backend import FAKE_BACKEND_VERSION, FakeBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.llama_ffi import LLAMA_CPP_PYTHON_VERSION
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard

PROMPTS = ((1, 270, 281, 289, 262, 280, 7, 9), (1, 5, 266, 266, 271))
DECODE_STEPS = 6


@dataclass(frozen=True)
class CertificationReport:
    backend_version: str
    checks: tuple[str, ...]
    whole_sha256: str
    """sha256 of every logit the whole models produced, float32 bytes, in the order compared."""
    split_sha256: str
    """The same over the split routes: equal to ``whole_sha256`` when every logit was bit-identical."""
    architecture: str = DEFAULT_SPEC.architecture
    weight_types: tuple[str, ...] = (DEFAULT_SPEC.weight_type.name,)
    embedding_type: str = DEFAULT_SPEC.embedding_type.name

    def bound_to(self, fingerprint: str) -> Certification:
        """This report as the evidence a node serving recipe ``fingerprint`` registers."""
        return Certification.seal(fingerprint, self.backend_version, self.checks, self.whole_sha256, self.split_sha256)


@dataclass
class LogitDigests:
    """Running sha256 of the whole side's and the split side's logits, fed by each comparison."""

    whole: hashlib._Hash = field(default_factory=hashlib.sha256)
    split: hashlib._Hash = field(default_factory=hashlib.sha256)

    def require(self, expected: np.ndarray | None, actual: np.ndarray | None, what: str) -> None:
        """``_require`` the two equal, then hash each side (a failed comparison raises first)."""
        _require(expected, actual, what)
        self.whole.update(np.ascontiguousarray(expected, np.float32).tobytes())
        self.split.update(np.ascontiguousarray(actual, np.float32).tobytes())


def certify_llama_engine(
    config: LlamaConfig | None = None,
    *,
    model: Path | None = None,
    repack: bool = True,
    device: DeviceInfo = CPU,
    kv_type: KvType = KvType.F16,
) -> CertificationReport:
    """Raise ``CertificationFailed`` unless split execution is bit-identical on this build.

    With ``model``, certify that model's architecture and every weight type it uses (and refuse
    one whose family or types cannot be certified); without, the default llama model.
    ``repack``: the served load setting (``LlamaConfig.repack``), which picks the kernels;
    ``device``: the device the worker serves on (its kernels are certified, not the CPU's);
    ``kv_type``: what the KV is stored as (a quantized KV is certified split == whole too).
    """
    config = config or LlamaConfig(
        max_slots=2, n_ctx_per_slot=256, max_batch_tokens=64, n_threads=1, repack=repack, device=device, kv_type=kv_type
    )
    # Its two-session step must run the batched kernels served to larger batches (llama_config).
    config = replace(config, split_small_decode_batches=False)
    specs = [DEFAULT_SPEC]
    if model is not None:
        try:
            specs = certification_specs(model)
        except MeshnetError as error:
            raise CertificationFailed(f"cannot certify {Path(model).name} on this build: {error}") from error
    checks: list[str] = []
    digests = LogitDigests()
    for spec in specs:
        found = _certify_spec(spec, config, digests)
        kv = "" if config.kv_type is KvType.F16 else f" kv {config.kv_type}"
        checks += [f"{spec.architecture} {spec.weight_type.name}{kv}: {check}" for check in found]
    return CertificationReport(
        LLAMA_CPP_PYTHON_VERSION,
        tuple(checks),
        digests.whole.hexdigest(),
        digests.split.hexdigest(),
        specs[0].architecture,
        tuple(spec.weight_type.name for spec in specs),
        specs[0].embedding_type.name,
    )


def certify_fake_engine(n_layers: int, n_embd: int, n_vocab: int) -> CertificationReport:
    """The same comparisons on the fake engine of these dimensions (``engine.fake_backend``),
    whose arithmetic splits like the real engine's: what a fake worker registers."""
    if n_layers < 2:
        raise CertificationFailed(f"a fake model of {n_layers} layer cannot be split to certify it; use 2 or more")

    def fake(layers: LayerRange) -> FakeBackend:
        return FakeBackend(layers, n_layers, n_embd=n_embd, n_vocab=n_vocab, max_slots=2, n_ctx_per_slot=256)

    whole = LocalRoute([fake(LayerRange(0, n_layers))])
    split = LocalRoute([fake(layers) for layers in split_evenly(n_layers, min(3, n_layers))])
    digests = LogitDigests()
    checks = tuple(f"fake: {check}" for check in _compare(whole, split, digests))
    return CertificationReport(
        FAKE_BACKEND_VERSION, checks, digests.whole.hexdigest(), digests.split.hexdigest(), "fake", ("none",), "none"
    )


def _certify_spec(spec: SyntheticSpec, config: LlamaConfig, digests: LogitDigests) -> tuple[str, ...]:
    block = config.kv_type.block_elements
    if spec.n_embd_head % block:  # llama.cpp stores a quantized KV only in whole blocks per head
        spec = replace(spec, head_dim=-(-spec.n_embd_head // block) * block)
    with tempfile.TemporaryDirectory(prefix="meshnet-certify-") as raw:
        folder = Path(raw)
        source = describe_model(write_synthetic_model(folder / "tiny.gguf", spec))
        cache = SliceCache(folder / "cache")
        try:
            whole = LocalRoute([open_llama_shard(source, LayerRange(0, spec.n_layers), cache, config)])
            split = LocalRoute([open_llama_shard(source, r, cache, config) for r in certification_cut(spec)])
        except MeshnetError as error:
            raise CertificationFailed(f"slices of a tiny model do not load on this build: {error}") from error
        try:
            return _compare(whole, split, digests)
        finally:
            whole.close()
            split.close()


def _compare(whole: LocalRoute, split: LocalRoute, digests: LogitDigests) -> tuple[str, ...]:
    checks = []
    for slot, prompt in enumerate(PROMPTS):
        tokens = np.array(prompt, np.int32)
        expected = whole.forward(slot, 0, tokens, "all")
        digests.require(expected, split.forward(slot, 0, tokens, "all"), f"prefill logits, prompt {slot}")
        for step in range(DECODE_STEPS):
            next_token = np.array([int(np.argmax(expected[-1]))], np.int32)
            expected = whole.forward(slot, len(prompt) + step, next_token)
            digests.require(expected, split.forward(slot, len(prompt) + step, next_token), f"decode step {step}")
        checks.append(f"prompt {slot}: prefill and {DECODE_STEPS} greedy steps bit-identical")
    # Both sessions now sit in the KV; one batched step must equal each session's solo step.
    head, tail = split.backends[0], split.backends[-1]
    positions = [len(p) + DECODE_STEPS for p in PROMPTS]
    solo = [whole.forward(s, positions[s], np.array([7], np.int32)) for s in range(len(PROMPTS))]
    hidden = head.run([StepInput(s, positions[s], tokens=np.array([7], np.int32)) for s in range(len(PROMPTS))])
    for backend in split.backends[1:-1]:
        hidden = backend.run([StepInput(o.slot, positions[o.slot], hidden=o.hidden) for o in hidden])
    batched = tail.run([StepInput(o.slot, positions[o.slot], hidden=o.hidden) for o in hidden])
    for output in batched:
        digests.require(solo[output.slot], output.logits, f"batched step of session {output.slot}")
    checks.append("batched decode of 2 sessions bit-identical to solo")
    checks.append(_check_isolation(whole, split, digests))
    checks.append(_check_restore(whole, split, digests))
    return tuple(checks)


def _check_isolation(whole: LocalRoute, split: LocalRoute, digests: LogitDigests) -> str:
    """A session's numerics must not depend on what other sessions did to the KV around it.

    Session 0 decodes alone on ``whole``; on ``split`` a second session is prefilled, released,
    and replaced by a third (its cells freed and reused) while session 0 decodes.
    """
    prompt = np.array(PROMPTS[0], np.int32)
    for route in (whole, split):
        route.release(0)
        route.release(1)
    expected = [whole.forward(0, 0, prompt)[-1]]
    actual = [split.forward(0, 0, prompt)[-1]]
    split.forward(1, 0, np.array(PROMPTS[1] * 3, np.int32))
    for step in range(DECODE_STEPS):
        token = np.array([int(np.argmax(expected[-1]))], np.int32)
        if step == 2:
            split.release(1)
            split.forward(1, 0, np.array(PROMPTS[1], np.int32))
        expected.append(whole.forward(0, len(prompt) + step, token)[-1])
        actual.append(split.forward(0, len(prompt) + step, token)[-1])
    for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
        digests.require(want, got, f"isolation step {index}")
    return "a session's output unchanged by other sessions freeing and reusing KV"


def _check_restore(whole: LocalRoute, split: LocalRoute, digests: LogitDigests) -> str:
    """KV exported at a prefill-chunk boundary and imported into another slot must continue
    exactly as the whole model's cold run: what prefix reuse and session snapshots serve with.

    Each shard's slot 0 holds exactly one aligned chunk; its export goes into the free slot 1
    of the same shard, slot 0 is freed, and slot 1 continues past another chunk boundary, then
    decodes. The cold side is the whole model prefilling the whole prompt.
    """
    chunk = split.backends[0].shape.max_batch_tokens
    prompt = np.array((PROMPTS[0] + PROMPTS[1]) * (2 * chunk // len(PROMPTS[0] + PROMPTS[1]) + 1), np.int32)
    prompt = prompt[: 2 * chunk + len(PROMPTS[1])]
    for route in (whole, split):
        route.release(0)
        route.release(1)
    expected = whole.forward(0, 0, prompt, "all")
    split.forward(0, 0, prompt[:chunk])
    try:
        blobs = [backend.export_slot(0) for backend in split.backends]
        split.release(0)
        for backend, blob in zip(split.backends, blobs, strict=True):
            backend.import_slot(1, blob, chunk)
    except MeshnetError as error:
        raise CertificationFailed(f"a shard's KV does not export and import back on this build: {error}") from error
    digests.require(expected[chunk:], split.forward(1, chunk, prompt[chunk:], "all"), "prefill after a KV restore")
    for step in range(DECODE_STEPS // 2):
        token = np.array([int(np.argmax(expected[-1]))], np.int32)
        expected = whole.forward(0, len(prompt) + step, token)
        digests.require(expected, split.forward(1, len(prompt) + step, token), f"decode step {step} after a KV restore")
    for route in (whole, split):
        route.release(0)
        route.release(1)
    return "KV exported at a chunk boundary, imported into another slot, continues bit-identically"


def _require(expected: np.ndarray | None, actual: np.ndarray | None, what: str) -> None:
    if expected is None or actual is None or expected.shape != actual.shape:
        raise CertificationFailed(f"{what}: split output has the wrong shape")
    if not bit_identical(expected, actual):
        raise CertificationFailed(
            f"{what}: split output differs from the whole model ({describe_difference(expected, actual)}); "
            "this llama.cpp build breaks the split engine's assumptions, refusing to serve"
        )
