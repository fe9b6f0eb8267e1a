"""The 8B-class acceptance in the lab: a Llama-3-8B-shaped Q4_0 model across three capped nodes.

    sudo env PYTHONPATH=src python scripts/bench_8b_lab.py --data-dir .data-8b --out bench/results/lab-8b.json

1. Writes the random-weight Llama-3-8B-shaped Q4_0 model (``llama3_8b_shaped_spec``: random
   blocks streamed to disk, no quantization pass) into ``DATA_DIR/models`` unless it is there.
2. Whole model: a child process loads it in one llama.cpp shard with ``use_mmap=False`` (the
   workers' recipe: one thread, their prefill chunk, the same context) and generates greedily;
   its peak RSS (VmHWM, load included) is what whole-model llama.cpp needs without mmap.
3. Lab: three namespaced nodes, each capped (cgroup) at 45% of that peak, one worker per node on
   an even split, the tracker and gateway on node 0; the same prompt and token count through the
   gateway's completions endpoint (streamed). Output must equal the whole model's, token for token.
4. Writes the JSON: per-node peak memory (cgroup high watermark), start-to-registered time, TTFT
   and decode tok/s beside the whole model's, the layer ranges, the caps, and how the gateway got
   its tokenizer.

Slow on purpose-free hardware (2 cores): run it once, not in a loop. Needs root (namespaces, cgroups).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.publish import MANIFEST_NAME, PublishOptions, publish
from meshnet.artifact.synthetic import write_synthetic_model
from meshnet.artifact.synthetic_models import llama3_8b_shaped_spec
from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.layers import LayerRange, split_evenly
from meshnet.deploy.lab.lab import Lab, LabConfig
from meshnet.deploy.lab.plan import LabNode
from meshnet.deploy.lab.swarm import LabSwarm, client_auth, start_swarm
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.logprobs import log_softmax
from meshnet.engine.shards import open_local_route
from meshnet.engine.tokenizer import Tokenizer
from meshnet.node.config import WorkerConfig
from meshnet.security.signing import load_or_create_key

MODEL_FILE = "synthetic-llama3-8b.Q4_0.gguf"
SERVED_NAME = "synthetic-llama3-8b"
FETCHED = re.compile(r"fetched layers \S+ of \S+: (\d+) bytes for (\d+) bytes of artifacts in ([\d.]+) s")
PROMPT = "Write one sentence about the sea."
TOKENS = 24
CONTEXT = 512
CAP_FRACTION = 0.45
TAG = "lab8b"
NODES = 3


def _vm_hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def whole_model(model: Path, cache_dir: Path) -> dict[str, Any]:
    """Run in a child process: load without mmap, generate greedily, report times and peak RSS."""
    description = describe_model(model)
    tokenizer = Tokenizer(description)
    config = LlamaConfig(
        max_batch_tokens=WorkerConfig.prefill_chunk, n_threads=1, max_slots=1, n_ctx_per_slot=CONTEXT, use_mmap=False
    )
    started = time.monotonic()
    route = open_local_route(description, 1, SliceCache(cache_dir), config)
    loaded = time.monotonic()
    prompt = tuple(tokenizer.encode(PROMPT, add_special=True))
    request = GenerationRequest(prompt, TOKENS, SamplingParams(), tokenizer.eos_token_ids)
    arrivals, tokens, rows = [], [], []
    sent = time.monotonic()
    for token in route.generate(request, on_logits=lambda logits: rows.append(logits.copy())):
        arrivals.append(time.monotonic())
        tokens.append(token)
    route.close()
    kept = list(itertools.takewhile(lambda t: t not in tokenizer.eos_token_ids, tokens))
    # As the gateway reports them: float32 log-softmax of the raw logits at each sampled token.
    logprobs = [min(float(np.float32(log_softmax(row)[t])), 0.0) for row, t in zip(rows, kept, strict=False)]
    return {
        "peak_rss_bytes": _vm_hwm_bytes(),
        "load_s": loaded - started,
        "prompt_tokens": len(prompt),
        "tokens": tokens,
        "text": tokenizer.decode(kept),
        "token_logprobs": logprobs,
        **_rates(sent, arrivals),
    }


def _rates(sent: float, arrivals: list[float]) -> dict[str, float]:
    """TTFT and the decode rate after the first token (tokens 2..n over their span)."""
    if not arrivals:
        return {"ttft_s": math.nan, "decode_tok_s": math.nan}
    span = arrivals[-1] - arrivals[0]
    return {"ttft_s": arrivals[0] - sent, "decode_tok_s": (len(arrivals) - 1) / span if span > 0 else math.nan}


def _process_memory(pid: int) -> dict[str, int]:
    """The worker's own peak resident set (VmHWM) and anonymous memory now, beside its group's peak
    (which also counts the page cache its slicing or fetching filled up to the cap)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {
        "rss_peak_bytes": int(fields["VmHWM"].split()[0]) * 1024,
        "rss_anon_bytes": int(fields["RssAnon"].split()[0]) * 1024,
    }


def _fetched(log: Path) -> dict[str, Any]:
    """What a model-id worker logged fetching (nothing for a worker that cut its range locally)."""
    found = FETCHED.search(log.read_text(errors="replace")) if log.exists() else None
    if found is None:
        return {}
    return {"fetched_bytes": int(found[1]), "needed_bytes": int(found[2]), "fetch_s": float(found[3])}


def artifacts_run(model: Path, data_dir: Path, out: Path) -> dict[str, Any]:
    """The same lab through the artifact plane: publish once, node 0 seeds, each worker fetches its range."""
    results = json.loads(out.read_text())
    published = data_dir / "published"
    if not (published / MANIFEST_NAME).exists():
        key, _ = load_or_create_key(data_dir / "publisher.key")
        publish(model, published, PublishOptions(SERVED_NAME, "none (random weights)"), key)
    n_layers = describe_model(model).n_layers
    run = lab_run(model, data_dir, results["cap_bytes"] // 2**20, split_evenly(n_layers, NODES), published)
    whole = results["whole"]
    run["greedy_equal"] = run["text"] == whole["text"]
    run["logprobs_equal"] = run["token_logprobs"] == whole["token_logprobs"]
    run["source_bytes"] = model.stat().st_size
    run["gateway"] = "reads its tokenizer from the whole GGUF (--model); the tokenizer artifact is t32b's"
    results["artifacts"] = run
    out.write_text(json.dumps(results, indent=2) + "\n")
    return run


class TimedLab(Lab):
    """The lab, noting how long each component took from start to its ready line."""

    start_seconds: dict[str, float]

    def start(self, node: LabNode, name: str, argv: Any, ready_prefix: str, role: str = "worker") -> Any:
        began = time.monotonic()
        child = super().start(node, name, argv, ready_prefix, role)
        self.__dict__.setdefault("start_seconds", {})[name] = time.monotonic() - began
        return child


def _stream(swarm: LabSwarm, model_name: str) -> dict[str, Any]:
    body = {
        "model": model_name,
        "prompt": PROMPT,
        "max_tokens": TOKENS,
        "temperature": 0,
        "stream": True,
        "logprobs": 1,
    }
    pieces, arrivals, logprobs = [], [], []
    sent = time.monotonic()
    url = f"{swarm.gateway_url}/v1/completions"
    with httpx.stream("POST", url, json=body, timeout=1800, headers=client_auth(swarm)) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices", ()):
                if choice.get("text"):
                    pieces.append(choice["text"])
                    arrivals.append(time.monotonic())
                logprobs += (choice.get("logprobs") or {}).get("token_logprobs") or []
    return {
        "text": "".join(pieces),
        "token_logprobs": logprobs,
        "streamed_chunks": len(pieces),
        **_rates(sent, arrivals),
    }


def lab_run(
    model: Path, data_dir: Path, cap_mb: int, ranges: list[LayerRange], published: Path | None = None
) -> dict[str, Any]:
    """One lab: build, serve the prompt once through the gateway, read each worker's group."""
    config = LabConfig(
        model=model,
        data_dir=data_dir,
        nodes=NODES,
        memory_mb=cap_mb,
        context=CONTEXT,
        sessions=1,
        threads=1,
        tag=TAG,
        ranges=tuple(ranges),
        model_name=SERVED_NAME,  # one name whether workers cut their range or fetch it by model id
        published=published,
    )
    lab = TimedLab(config)
    try:
        plan = lab.build()
        swarm = start_swarm(lab)
        answer = _stream(swarm, SERVED_NAME)
        memory = lab.worker_memory()
        rss = {child.name: _process_memory(child.pid) for child in lab.components}
        nodes = [
            {
                "node": node.index,
                "cpu": node.cpu,
                "cap_bytes": cap_mb * 2**20,
                "layers": str(swarm.ranges[node.index]),
                "peak_bytes": memory[node.index][0],
                "oom_kills": memory[node.index][1],
                **rss[f"worker-n{node.index}"],
                "start_to_registered_s": lab.start_seconds[f"worker-n{node.index}"],
                **_fetched(lab.logs / f"worker-n{node.index}.log"),
            }
            for node in plan.serving()
        ]
        return {"nodes": nodes, "gateway_start_s": lab.start_seconds.get("gateway"), **answer}
    finally:
        lab.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path(".data-8b"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/lab-8b.json"))
    parser.add_argument("--cap-mb", type=int, help="a fixed cap instead of 45%% of the whole model's peak (dry runs)")
    parser.add_argument("--artifacts-only", action="store_true", help="add the artifact-plane run to --out")
    parser.add_argument("--whole-only", action="store_true", help="(internal) the whole-model child")
    args = parser.parse_args(argv)
    model = args.data_dir / "models" / MODEL_FILE
    cache_dir = args.data_dir / "whole-cache"
    if args.whole_only:
        print(json.dumps(whole_model(model, cache_dir)))
        return 0
    if args.artifacts_only:
        run = artifacts_run(model, args.data_dir, args.out)
        print(json.dumps({k: run[k] for k in ("greedy_equal", "logprobs_equal")}), flush=True)
        return 0 if run["greedy_equal"] and run["logprobs_equal"] else 1
    if not model.exists():
        began = time.monotonic()
        model.parent.mkdir(parents=True, exist_ok=True)
        write_synthetic_model(model, llama3_8b_shaped_spec())
        print(f"wrote {model} ({model.stat().st_size} bytes) in {time.monotonic() - began:.1f} s", flush=True)
    description = describe_model(model)
    # The whole slice is cut here, so the child's peak is the load and the generation alone.
    SliceCache(cache_dir).shard_files(model, LayerRange(0, description.n_layers), description.n_layers)
    child = subprocess.run(
        [sys.executable, __file__, "--data-dir", str(args.data_dir), "--whole-only"],
        check=True,
        capture_output=True,
        text=True,
    )
    whole = json.loads(child.stdout.strip().splitlines()[-1])
    shutil.rmtree(cache_dir)  # the whole slice (one more copy of the model) is not needed again
    print(f"whole model: peak {whole['peak_rss_bytes'] / 2**20:.0f} MiB, {whole['decode_tok_s']:.2f} tok/s", flush=True)
    cap_mb = args.cap_mb or int(CAP_FRACTION * whole["peak_rss_bytes"] / 2**20)
    ranges = split_evenly(description.n_layers, NODES)
    lab = lab_run(model, args.data_dir, cap_mb, ranges)
    results = {
        "schema": "meshnet-lab-8b/1",
        "model": {
            "file": MODEL_FILE,
            "bytes": model.stat().st_size,
            "shape": "Llama-3-8B: 32 layers, n_embd 4096, 32/8 heads, n_ff 14336, 128,256 tokens, untied head",
            "types": "Q4_0 blocks and token table, Q6_K LM head (random blocks, no quantization pass)",
            "vocabulary": "SentencePiece padded with plain pieces to 128,256 (not Llama 3's BPE)",
        },
        "prompt": PROMPT,
        "max_tokens": TOKENS,
        "context": CONTEXT,
        "threads_per_process": 1,
        "cap_fraction_of_whole_peak": CAP_FRACTION,
        "cap_bytes": cap_mb * 2**20,
        "whole": {k: v for k, v in whole.items() if k != "tokens"} | {"generated_tokens": len(whole["tokens"])},
        "lab": lab,
        "greedy_equal": lab["text"] == whole["text"],
        "logprobs_equal": lab["token_logprobs"] == whole["token_logprobs"],
        "gateway": "loads the whole GGUF's vocabulary (vocab_only, mapped: no tensors) from --model; the "
        "tokenizer-only artifact (gateway --model-id) is t32b's",
        "artifacts": "not run: the lab starts workers with --model (each cuts its range from the source "
        "file); no model-id path in deploy/lab or up yet",
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "created_unix_s": time.time(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: results[k] for k in ("greedy_equal", "logprobs_equal", "cap_bytes")}), flush=True)
    return 0 if results["greedy_equal"] and results["logprobs_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
