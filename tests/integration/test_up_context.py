"""`meshnet up`'s context and KV type, as a real process on a synthetic model trained for 4,096
positions: by default every session holds the model's trained length (not 2,048), /v1/models and
a refused prompt say the same figure, a 3,000-token prompt through the q8_0 swarm answers what
the whole model answers, and a --context past the trained length is refused before anything starts.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gguf import GGMLQuantizationType
from swarm_harness import meshnet_command

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "engine"))

from engine_routes import greedy, prompt

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.kv_type import KvType
from meshnet.core.layers import LayerRange
from meshnet.deploy.launch.ready_lines import UpLine
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard
from meshnet.engine.tokenizer import Tokenizer
from meshnet.node.config import WorkerConfig
from meshnet.process.launcher import ChildProcess, LaunchSpec

pytestmark = pytest.mark.timeout(240)

TRAINED = 4096
SPEC = SyntheticSpec(
    n_layers=6, head_dim=32, n_ctx_train=TRAINED, weight_type=GGMLQuantizationType.Q8_0, tied_embeddings=False
)
"""Heads 32 wide, so the KV can be stored as q8_0 blocks."""
PROMPT_TOKENS, ANSWER_TOKENS = 3000, 8


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_synthetic_model(tmp_path / "long.gguf", SPEC)


@pytest.fixture
def up(tmp_path: Path, model: Path) -> Iterator[tuple[str, dict[str, str]]]:
    port = _free_port()
    command = meshnet_command(
        tmp_path, "up", "--model", str(model), "--shards", "2", "--port", str(port), "--kv-type", "q8_0",
        "--max-tokens", "2", "--prompt", "hi",
    )  # fmt: skip
    child = ChildProcess(LaunchSpec("up", tuple(command), tmp_path / "up.log", UpLine.PREFIX))
    try:
        child.await_ready(time.monotonic() + 120)
        key = (tmp_path / "api-key").read_text().strip()
        yield f"http://127.0.0.1:{port}/v1", {"Authorization": f"Bearer {key}"}
    finally:
        child.stop()


def _whole_model_text(model: Path, tokens: list[int]) -> str:
    config = LlamaConfig(
        n_threads=1,
        max_slots=1,
        n_ctx_per_slot=TRAINED,
        max_batch_tokens=WorkerConfig.prefill_chunk,
        kv_type=KvType.Q8_0,
    )
    description = describe_model(model)
    whole = LocalRoute(
        [open_llama_shard(description, LayerRange(0, SPEC.n_layers), SliceCache(model.parent / "ref"), config)]
    )
    try:
        return Tokenizer(description).decode(greedy(whole, tokens, ANSWER_TOKENS).tokens)  # type: ignore[arg-type]
    finally:
        whole.close()


def test_up_serves_the_trained_context_and_a_long_prompt_equals_the_whole_model(
    up: tuple[str, dict[str, str]], model: Path
) -> None:
    base, auth = up
    card = httpx.get(f"{base}/models", headers=auth, timeout=10).json()["data"][0]
    assert card["context_length"] == TRAINED  # was 2,048 whatever the model
    tokens = [int(t) for t in prompt(PROMPT_TOKENS, 11)]
    body = {"model": card["id"], "prompt": tokens, "max_tokens": ANSWER_TOKENS, "temperature": 0}
    answer = httpx.post(f"{base}/completions", json=body, headers=auth, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] == _whole_model_text(model, tokens)
    too_long = {**body, "prompt": [int(t) for t in prompt(TRAINED + 10, 12)]}
    refused = httpx.post(f"{base}/completions", json=too_long, headers=auth, timeout=30)
    assert refused.status_code == 400 and f"context holds {TRAINED}" in refused.json()["error"]["message"]


def test_up_refuses_a_context_past_the_trained_length(tmp_path: Path, model: Path) -> None:
    command = meshnet_command(tmp_path, "up", "--model", str(model), "--port", str(_free_port()), "--context", "8192")
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert f"--context 8192: a session holds 1 to {TRAINED} positions" in done.stderr
    assert not (tmp_path / "logs" / "tracker.log").exists()  # nothing started
