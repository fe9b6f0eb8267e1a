"""``meshnet gateway --model-id`` end to end on a synthetic model: a real tracker, a seeder holding
the published model, two workers started from the model id, and a gateway started from the
model id with an empty data dir. The official ``openai`` client gets the whole model's output
under the published name, and the gateway's disk holds no GGUF but the signed tokenizer artifact.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "artifact"))
from artifact_harness import ArtifactSwarm, seeders, wait_for_holders
from artifact_published import Published, publish_model
from worker_harness import WorkerCluster, WorkerSpec

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.layers import LayerRange
from meshnet.deploy.launch.commands import gateway_command, tracker_launch
from meshnet.deploy.launch.ready_lines import GatewayLine, TrackerLine
from meshnet.gateway.config import GatewayConfig, GatewayProcessConfig
from meshnet.process.launcher import ChildProcess, LaunchSpec, stop_all
from meshnet.tracker.config import TrackerConfig

pytestmark = pytest.mark.timeout(240)
MODEL_ID = "tiny-published"
MESSAGES = [{"role": "user", "content": "the sea is"}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gateway-by-id")


@pytest.fixture(scope="module")
def published(folder: Path, synthetic_model_factory: Any) -> Published:
    # Published under a name that is neither the file's stem nor its general.name.
    return publish_model(synthetic_model_factory(SyntheticSpec(n_layers=4)), folder, MODEL_ID, piece_size=1 << 16)


@pytest.fixture(scope="module")
def tracker(folder: Path) -> Iterator[ArtifactSwarm]:
    home = folder / "tracker"
    launch = tracker_launch(TrackerConfig(port=0, join_port=0, heartbeat_interval_s=0.5), home)
    log = folder / "tracker.log"
    child = ChildProcess(LaunchSpec("tracker", launch.argv, log, TrackerLine.PREFIX, dict(launch.environment)))
    try:
        yield ArtifactSwarm(home, TrackerLine.read(child.await_ready(time.monotonic() + 30)).address)
    finally:
        stop_all([child])


@pytest.fixture(scope="module")
def gateway(folder: Path, tracker: ArtifactSwarm, published: Published) -> Iterator[tuple[str, Path]]:
    with seeders(folder, tracker, published.directory):
        asyncio.run(wait_for_holders(tracker.address, MODEL_ID, 1, tracker.security))
        settings = {"model_id": MODEL_ID, "tracker": tracker.address}
        with WorkerCluster(folder / "workers") as cluster:
            specs = [
                WorkerSpec(
                    LayerRange(a, b),
                    fake_layers=None,
                    context=256,
                    max_sessions=2,
                    threads=1,
                    settings=settings,
                    security=tracker.identity_options(f"worker-{a}-{b}"),
                )
                for a, b in ((0, 2), (2, 4))
            ]
            cluster.start(*specs, timeout_s=120)
            home = folder / "gateway-home"
            config = GatewayProcessConfig(
                tracker=tracker.address, model_id=MODEL_ID, http=GatewayConfig(port=0), data_dir=home,
                audit_fraction=0.0, allow_anonymous=True,
            )  # fmt: skip
            command = gateway_command(config, tracker.identity_options("gateway", "gateway"))
            child = ChildProcess(LaunchSpec("gateway", command, folder / "gateway.log", GatewayLine.PREFIX))
            try:
                ready = GatewayLine.read(child.await_ready(time.monotonic() + 60))
                assert ready.model == MODEL_ID
                yield ready.url, home
            finally:
                stop_all([child])


def _whole_model_answer(published: Published, folder: Path, max_tokens: int) -> tuple[list[int], str]:
    from meshnet.engine.llama_config import LlamaConfig
    from meshnet.engine.shards import open_local_route
    from meshnet.engine.tokenizer import Tokenizer

    whole = Tokenizer(describe_model(published.source))
    prompt = whole.encode_chat(MESSAGES)
    config = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=256, max_batch_tokens=64)
    route = open_local_route(describe_model(published.source), 1, SliceCache(folder / "reference"), config)
    request = GenerationRequest(tuple(prompt), max_tokens, SamplingParams(), whole.eos_token_ids)
    tokens = [t for t in route.generate(request) if t not in whole.eos_token_ids]
    route.close()
    text = whole.decode(tokens)
    whole.close()
    return prompt, text


def test_a_gateway_by_model_id_serves_the_whole_models_output_without_weights(
    folder: Path, gateway: tuple[str, Path], published: Published
) -> None:
    url, home = gateway
    prompt, expected = _whole_model_answer(published, folder, 12)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    assert [model.id for model in client.models.list().data] == [MODEL_ID]
    answer = client.chat.completions.create(
        model=MODEL_ID,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
    )
    assert answer.choices[0].message.content == expected
    assert answer.usage is not None and answer.usage.prompt_tokens == len(prompt)
    tokenizer = published.manifest.tokenizer()
    files = [path for path in home.rglob("*") if path.is_file()]
    ggufs = [path for path in files if path.suffix == ".gguf"]
    assert [hashlib.sha256(path.read_bytes()).hexdigest() for path in ggufs] == [tokenizer.sha256]
    # Beside it only the manifest, the trust record and the gateway's own databases (its outbox).
    kept = [path for path in files if ".sqlite3" not in path.name]
    manifest_size = (published.directory / "manifest.json").stat().st_size
    assert sum(path.stat().st_size for path in kept) <= tokenizer.size + manifest_size + 4096
