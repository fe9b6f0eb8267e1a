"""Check one GPU build of llama.cpp the way a worker relies on it, and time it: certification,
split == whole on real-sized models, drift from the CPU, and prefill / decode rates.

    python scripts/device_check.py --device cuda --out bench/results/device-cuda.json \
        [--models families,synthetic-1b,synthetic-8b] [--prompt-tokens 512] [--decode-tokens 64]

For each model (random-weight synthetic GGUFs written here, so no model hub is needed): the whole
model and an even 3-way split, both on the device, in one process (the seams are the in-process
hand-over a worker's gRPC hop carries), run the same greedy request; every logit row the tail
produced is compared bitwise and the generated tokens must be equal. The CPU whole model runs the
same request where it is cheap enough, for the drift a mixed route would carry. Timings are the
best of ``--repetitions`` (each a fresh slot), as ratios within the run. Nothing here asserts a
speed; the JSON is the record (``bench/results/``).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import platform
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.footprint import memory_footprint
from meshnet.artifact.synthetic import FAMILIES, SyntheticSpec, write_synthetic_model
from meshnet.artifact.synthetic_models import llama3_8b_shaped_spec, tinyllama_shaped_spec
from meshnet.core.devices import CPU, DeviceInfo, DeviceRequest
from meshnet.core.generation import GenerationRequest
from meshnet.engine.certification import certify_llama_engine
from meshnet.engine.device_drift import measure_device_drift
from meshnet.engine.devices import find_device, offered_devices
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_local_route


def model_specs(names: list[str]) -> dict[str, SyntheticSpec]:
    specs: dict[str, SyntheticSpec] = {}
    for name in names:
        if name == "families":
            specs.update({f"tiny-{family}": SyntheticSpec(architecture=family, n_layers=6) for family in FAMILIES})
        elif name == "synthetic-1b":
            specs[name] = tinyllama_shaped_spec()
        elif name == "synthetic-8b":
            specs[name] = llama3_8b_shaped_spec()
        else:
            raise SystemExit(f"unknown model set {name!r}: families, synthetic-1b, synthetic-8b")
    return specs


@dataclass
class Run:
    tokens: list[int]
    logits_sha256: str
    rows: list[np.ndarray] = field(repr=False)
    prefill_s: float
    decode_tok_s: float


def keep_copy(rows: list[np.ndarray], row: np.ndarray) -> None:
    rows.append(np.array(row, np.float32))  # the engine may reuse its logits buffer


def run_route(route: LocalRoute, prompt: tuple[int, ...], decode: int, repetitions: int) -> Run:
    best: Run | None = None
    for _ in range(repetitions):
        rows: list[np.ndarray] = []
        request = GenerationRequest(prompt, decode)
        started = time.perf_counter()
        first = started
        tokens: list[int] = []
        for token in route.generate(request, on_logits=functools.partial(keep_copy, rows)):
            if not tokens:
                first = time.perf_counter()
            tokens.append(token)
        ended = time.perf_counter()
        digest = hashlib.sha256(b"".join(row.tobytes() for row in rows)).hexdigest()
        decode_rate = (len(tokens) - 1) / max(ended - first, 1e-9)
        run = Run(tokens, digest, rows, first - started, decode_rate)
        if best is not None and (run.tokens != best.tokens or run.logits_sha256 != best.logits_sha256):
            raise SystemExit("the same route gave two different answers to one request: not deterministic")
        if best is None or run.prefill_s + 1 / run.decode_tok_s < best.prefill_s + 1 / best.decode_tok_s:
            best = run
    assert best is not None  # noqa: S101 (a script: repetitions >= 1)
    return best


def config_for(device: DeviceInfo, args: argparse.Namespace) -> LlamaConfig:
    return LlamaConfig(
        n_threads=args.threads,
        max_slots=1,
        n_ctx_per_slot=args.prompt_tokens + args.decode_tokens + 8,
        max_batch_tokens=args.batch,
        device=device,
    )


def check_model(name: str, spec: SyntheticSpec, device: DeviceInfo, folder: Path, args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    path = write_synthetic_model(folder / f"{name}.gguf", spec)
    written_s = time.perf_counter() - started
    source = describe_model(path)
    cache = SliceCache(folder / "cache")
    vocab = memory_footprint(path).n_vocab
    rng = np.random.default_rng(7)
    prompt = (1, *(int(t) for t in rng.integers(3, max(vocab, 4), size=args.prompt_tokens - 1)))
    report: dict = {"spec": {k: str(v) for k, v in vars(spec).items()}, "bytes": path.stat().st_size}
    report["write_s"] = round(written_s, 2)
    runs: dict[str, Run] = {}
    lanes = [("whole", device, 1), ("split-3", device, 3)]
    if args.cpu_reference and path.stat().st_size < args.cpu_max_bytes:
        lanes.append(("cpu-whole", CPU, 1))
    for lane, on, shards in lanes:
        load_started = time.perf_counter()
        route = open_local_route(source, shards, cache, config_for(on, args))
        load_s = time.perf_counter() - load_started
        try:
            runs[lane] = run_route(route, prompt, args.decode_tokens, args.repetitions)
        finally:
            route.close()
        run = runs[lane]
        report[lane] = {
            "load_s": round(load_s, 3),
            "prefill_s": round(run.prefill_s, 4),
            "prefill_tok_s": round(len(prompt) / max(run.prefill_s, 1e-9), 1),
            "decode_tok_s": round(run.decode_tok_s, 1),
            "tokens": len(run.tokens),
            "logits_sha256": run.logits_sha256,
        }
        print(f"{name} {lane}: {report[lane]}", flush=True)
    whole, split = runs["whole"], runs["split-3"]
    report["split_equals_whole"] = whole.tokens == split.tokens and whole.logits_sha256 == split.logits_sha256
    report["split_vs_whole_decode"] = round(split.decode_tok_s / whole.decode_tok_s, 3)
    if "cpu-whole" in runs:
        cpu = runs["cpu-whole"]
        count = min(len(cpu.rows), len(whole.rows))
        diffs = [float(np.max(np.abs(cpu.rows[i] - whole.rows[i]))) for i in range(count)]
        report["vs_cpu"] = {
            "tokens_equal": cpu.tokens == whole.tokens,
            "first_token_divergence": next(
                (i for i, (a, b) in enumerate(zip(cpu.tokens, whole.tokens, strict=False)) if a != b), None
            ),
            "max_abs_logit_diff": max(diffs) if diffs else 0.0,
            "device_vs_cpu_decode": round(whole.decode_tok_s / cpu.decode_tok_s, 2),
            "device_vs_cpu_prefill": round(cpu.prefill_s / max(whole.prefill_s, 1e-9), 2),
        }
    print(f"{name}: split == whole: {report['split_equals_whole']}", flush=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="families,synthetic-1b")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--cpu-reference", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--cpu-max-bytes", type=int, default=800_000_000)
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args()
    device = find_device(DeviceRequest.parse(args.device))
    result: dict = {
        "host": platform.node(),
        "devices": [vars(d) for d in offered_devices()],
        "device": vars(device),
        "settings": {k: str(v) for k, v in vars(args).items()},
    }
    started = time.perf_counter()
    certification = certify_llama_engine(device=device)
    result["certification"] = {"s": round(time.perf_counter() - started, 2), "checks": list(certification.checks)}
    result["certification"]["bitwise"] = certification.whole_sha256 == certification.split_sha256
    print(f"certified {device}: {result['certification']}", flush=True)
    if device.is_gpu:
        drift = measure_device_drift(device)
        result["drift"] = vars(drift)
        print(f"drift: {result['drift']}", flush=True)
    result["models"] = {}
    with tempfile.TemporaryDirectory(prefix="meshnet-device-", dir=args.work_dir) as raw:
        for name, spec in model_specs(args.models.split(",")).items():
            try:
                result["models"][name] = check_model(name, spec, device, Path(raw), args)
            except Exception as error:  # a script's record: one model's failure must not lose the others
                result["models"][name] = {"error": f"{type(error).__name__}: {error}"}
                print(f"{name}: FAILED {error!r}", flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    ok = all(m.get("split_equals_whole") for m in result["models"].values())
    print(f"wrote {args.out}; every split == whole: {ok}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
