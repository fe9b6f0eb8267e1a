"""`meshnet up --expert-parallel 2` as a real process on a synthetic qwen3moe (64 experts, top-8, Q4_0).

- The demo streams through a group of two ``meshnet worker --experts I/2`` processes, and every
  logit it sampled from equals whole-model llama.cpp in this process bit for bit (a crc32 over
  the logits' bits, printed by `up`), as do the sampled ids. By default the nodes and the demo
  driver hold identities minted from the data dir's swarm CA (mTLS links); `--insecure` keeps
  the group plaintext, with no identities minted.
- A group cannot take a restarted node back, so when a node is killed under a serving `up`,
  `up` restarts nothing: it stops the other node and exits with code 2 and a structured error.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import zlib
from pathlib import Path

import numpy as np
import psutil
import pytest
from gguf import GGMLQuantizationType as Quant

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.generation import GenerationRequest
from meshnet.core.layers import LayerRange
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.tokenizer import Tokenizer
from meshnet.expert_swarm import demo_prompt
from meshnet.process.launcher import ChildProcess, LaunchSpec, meshnet_command
from meshnet.worker.config import WorkerConfig

pytestmark = pytest.mark.timeout(300)

SPEC = SyntheticSpec(
    architecture="qwen3moe", n_layers=2, n_expert=64, n_expert_used=8, n_ff_expert=32, weight_type=Quant.Q4_0
)
PROMPT = "the quick brown fox"
MAX_TOKENS = 16
SERVING = "Serving the expert-parallel group at "


def _up(root: Path, model: Path, *extra: str) -> list[str]:
    flags = ["--model", str(model), "--expert-parallel", "2", "--max-tokens", str(MAX_TOKENS), "--prompt", PROMPT]
    return list(meshnet_command(root / "data", "up", *flags, *extra))


def _whole_model(root: Path, model: Path, spec: SyntheticSpec) -> tuple[list[int], int]:
    """Greedy ids and the crc32 over every sampled-from logit row, whole model, the nodes' settings."""
    layers = LayerRange(0, spec.n_layers)
    worker = WorkerConfig(model=model, layer_choice=layers, data_dir=root, threads=1)  # up: --threads 1
    whole = SliceCache(root / "ref").shard_files(model, layers, spec.n_layers).slice
    source = describe_model(model)
    tokenizer = Tokenizer(source)
    prompt = demo_prompt(tokenizer, source, PROMPT)
    route = LocalRoute([LlamaBackend(whole, worker.llama_config(worker.max_sessions))])
    digest = [0]

    def fold(logits: np.ndarray) -> None:
        digest[0] = zlib.crc32(np.ascontiguousarray(logits, np.float32).tobytes(), digest[0])

    try:
        request = GenerationRequest(tuple(prompt), MAX_TOKENS, stop_tokens=tokenizer.eos_token_ids)
        tokens = list(route.generate(request, on_logits=fold))
    finally:
        route.close()
    return tokens, digest[0]


CACHED_SPEC = SyntheticSpec(
    architecture="qwen3moe", n_layers=2, n_expert=16, n_expert_used=4, n_ff_expert=32, weight_type=Quant.Q8_0
)  # Q8_0: not repacked, so the nodes' expert cache can bound what the kernels read


@pytest.mark.parametrize(
    ("spec", "extra"),
    [(SPEC, ()), (CACHED_SPEC, ("--expert-cache-mb", "0.05", "--insecure"))],
    ids=["q4_0-repacked-mtls", "q8_0-expert-cache-insecure"],
)
def test_up_expert_parallel_demo_equals_whole_model(
    tmp_path: Path, spec: SyntheticSpec, extra: tuple[str, ...]
) -> None:
    model = write_synthetic_model(tmp_path / "moe.gguf", spec)
    done = subprocess.run(_up(tmp_path, model, "--demo-only", *extra), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(re.findall(r"^expert +127\.0\.0\.1:\d+ +experts [01]/2", done.stdout, re.M)) == 2, done.stdout
    summary = re.search(r"through 2 expert nodes; logits crc32 ([0-9a-f]{8}); ids ([\d ]+)\]", done.stdout)
    assert summary is not None, done.stdout
    tokens, crc = _whole_model(tmp_path, model, spec)
    assert [int(t) for t in summary.group(2).split()] == tokens
    assert int(summary.group(1), 16) == crc
    caches = re.findall(r"node \d: expert cache .* hit rate ([\d.]+), ([\d.]+) MB read", done.stdout)
    assert len(caches) == (2 if extra else 0), done.stdout
    assert all(float(read) > 0 for _, read in caches)
    minted = sorted(p.name for p in (tmp_path / "data" / "swarm" / "nodes").glob("expert-*"))
    assert minted == ([] if "--insecure" in extra else ["expert-2-0", "expert-2-1", "expert-driver"])


def test_up_expert_parallel_ends_when_a_node_dies(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path / "moe.gguf", SPEC)
    up = ChildProcess(LaunchSpec("up", tuple(_up(tmp_path, model)), tmp_path / "up.log", SERVING))
    try:
        up.await_ready(time.monotonic() + 240)
        status = json.loads((tmp_path / "data" / "logs" / "up-status.json").read_text())
        pids = {c["name"]: c["pid"] for c in status["components"]}
        assert sorted(pids) == ["expert-2-0", "expert-2-1"]
        psutil.Process(pids["expert-2-1"]).send_signal(signal.SIGKILL)
        assert up.wait_exit(60) == 2, up.log_tail()
        assert "crash_loop" in up.log_tail(), up.log_tail()
        assert not psutil.pid_exists(pids["expert-2-0"]) or psutil.Process(pids["expert-2-0"]).status() == "zombie"
    finally:
        up.stop()
