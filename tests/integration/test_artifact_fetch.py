"""Fetching a range by model id from seeder processes over loopback gRPC: only the needed
artifacts, every piece verified, bad and dead holders replaced, untrusted publishers refused."""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "artifact"))
from artifact_harness import running_tracker, seeders, wait_for_holders
from artifact_published import Published, publish_model

from meshnet.artifact.directory import Advertisement
from meshnet.artifact.manifest import needed_artifacts
from meshnet.artifact.slicing import write_slice
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.artifact.trust import UntrustedPublisher
from meshnet.core.errors import PermissionDenied, Unavailable
from meshnet.core.layers import LayerRange
from meshnet.deploy.launch.ready_lines import SeedLine
from meshnet.fetch.fetcher import FetchConfig, fetch_range
from meshnet.fetch.holders import artifact_channel, fetch_bytes
from meshnet.membership.announce import announce_forever
from meshnet.membership.reach import Reach
from meshnet.membership.tracker_client import TrackerClient
from meshnet.security.certificates import create_authority, mint_node
from meshnet.security.identity import ANY_WORKER_NAME
from meshnet.security.signing import load_or_create_key
from meshnet.security.swarm_dir import load_authority
from meshnet.wire import artifact_wire, services
from meshnet.wire.tls import LinkSecurity, channel_options, hop_server_name

pytestmark = pytest.mark.timeout(120)
MODEL_ID = "tiny-llama"


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, synthetic_model_factory: Any) -> Published:
    source = synthetic_model_factory(SyntheticSpec(n_layers=6, n_embd=128, n_ff=256))
    return publish_model(source, tmp_path_factory.mktemp("fetch-published"), MODEL_ID)


def copy_of(published: Published, folder: Path) -> Path:
    shutil.copytree(published.directory, folder)
    return folder


def reference(published: Published, layers: LayerRange, folder: Path) -> bytes:
    path = folder / f"reference-{layers.start}-{layers.stop}.gguf"
    write_slice(published.source, layers, path)
    return path.read_bytes()


async def test_a_middle_range_fetches_only_its_artifacts(published: Published, tmp_path: Path) -> None:
    layers = LayerRange(2, 4)
    async with running_tracker(tmp_path) as tracker:
        second = copy_of(published, tmp_path / "second")
        with seeders(tmp_path, tracker, published.directory, second):
            await wait_for_holders(tracker.address, MODEL_ID, 2, tracker.security)
            config = FetchConfig(MODEL_ID, layers, tracker.address, tmp_path / "node")
            fetched = await fetch_range(config, security=tracker.security)
            assert fetched.files.slice.read_bytes() == reference(published, layers, tmp_path)
            needed = needed_artifacts(published.manifest, layers)
            assert fetched.needed_bytes == sum(e.size for e in needed)
            manifest_bytes = fetched.manifest_path.stat().st_size
            assert fetched.fetched_bytes == fetched.needed_bytes + manifest_bytes
            assert fetched.bad_holders == () and fetched.dead_holders == ()
            assert not (tmp_path / "node" / "models-by-id" / MODEL_ID / "partial").exists()
            # A rerun finds the slice in the cache and the manifest trusted on first use.
            again = await fetch_range(config, security=tracker.security)
            assert again.files.slice == fetched.files.slice


async def test_a_tampered_holder_is_refused_and_replaced(published: Published, tmp_path: Path) -> None:
    layers = LayerRange(3, 6)  # a tail: blocks, the output and the token table
    async with running_tracker(tmp_path) as tracker:
        tampered = copy_of(published, tmp_path / "tampered")
        with seeders(tmp_path, tracker, published.directory, tampered) as children:
            await wait_for_holders(tracker.address, MODEL_ID, 2, tracker.security)
            # Damaged after the seeder checked its files at start: it now serves bad bytes.
            for entry in published.manifest.of_kind("layer"):
                artifact = tampered / "artifacts" / entry.sha256
                data = bytearray(artifact.read_bytes())
                for offset in range(0, len(data), entry.piece_size):
                    data[offset] ^= 0xFF
                artifact.write_bytes(bytes(data))
            fetched = await fetch_range(
                FetchConfig(MODEL_ID, layers, tracker.address, tmp_path / "node"), security=tracker.security
            )
            assert fetched.files.slice.read_bytes() == reference(published, layers, tmp_path)
            tampered_address = SeedLine.read(children[1].ready).address if children[1].ready else ""
            assert fetched.bad_holders == (tampered_address,)


async def test_a_holder_killed_mid_fetch_is_replaced(published: Published, tmp_path: Path) -> None:
    layers = LayerRange(0, 4)
    async with running_tracker(tmp_path) as tracker:
        second = copy_of(published, tmp_path / "second")
        with seeders(tmp_path, tracker, published.directory, second) as children:
            await wait_for_holders(tracker.address, MODEL_ID, 2, tracker.security)
            killed: list[int] = []

            def progress(done: int, total: int) -> None:
                if not killed and done > total // 4:
                    children[0].send_signal(signal.SIGKILL)
                    killed.append(done)

            config = FetchConfig(MODEL_ID, layers, tracker.address, tmp_path / "node", requests_per_holder=1)
            fetched = await fetch_range(config, progress, tracker.security)
            assert killed and killed[0] < fetched.needed_bytes
            assert fetched.files.slice.read_bytes() == reference(published, layers, tmp_path)
            assert fetched.files.embeddings is not None
            assert fetched.dead_holders == (SeedLine.read(children[0].ready).address,)  # type: ignore[arg-type]


async def test_an_untrusted_publisher_is_refused(published: Published, tmp_path: Path) -> None:
    other, _ = load_or_create_key(tmp_path / "other.key")
    async with running_tracker(tmp_path) as tracker:
        with seeders(tmp_path, tracker, published.directory):
            await wait_for_holders(tracker.address, MODEL_ID, 1, tracker.security)
            pinned = FetchConfig(
                MODEL_ID, LayerRange(0, 2), tracker.address, tmp_path / "a", trust_publisher=other.fingerprint
            )
            with pytest.raises(UntrustedPublisher, match="not the pinned"):
                await fetch_range(pinned, security=tracker.security)
            assert not list((tmp_path / "a").rglob("*.gguf"))
    # Trust on first use: a node that trusted another key for this model id refuses this one.
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "trusted-publishers.json").write_text(f'{{"{MODEL_ID}": "{other.fingerprint}"}}')
    async with running_tracker(tmp_path / "t2") as tracker:
        with seeders(tmp_path / "t2", tracker, published.directory):
            await wait_for_holders(tracker.address, MODEL_ID, 1, tracker.security)
            with pytest.raises(UntrustedPublisher, match="first use"):
                await fetch_range(
                    FetchConfig(MODEL_ID, LayerRange(0, 2), tracker.address, tmp_path / "b"), security=tracker.security
                )


class Interrupted(Exception):
    pass


async def test_an_interrupted_fetch_resumes_with_what_it_has(published: Published, tmp_path: Path) -> None:
    layers = LayerRange(1, 5)
    async with running_tracker(tmp_path) as tracker:
        with seeders(tmp_path, tracker, published.directory):
            await wait_for_holders(tracker.address, MODEL_ID, 1, tracker.security)
            config = FetchConfig(MODEL_ID, layers, tracker.address, tmp_path / "node", requests_per_holder=1)

            def interrupt(done: int, total: int) -> None:
                if done > total // 2:
                    raise Interrupted

            with pytest.raises(Interrupted):
                await fetch_range(config, interrupt, tracker.security)
            leftovers = [p for p in (tmp_path / "node").rglob("*") if p.is_file() and p.suffix == ".gguf"]
            assert leftovers == []  # only the .partial sparse copy, nothing that looks complete
            resumed = await fetch_range(config, security=tracker.security)
            manifest_bytes = resumed.manifest_path.stat().st_size
            assert resumed.fetched_bytes - manifest_bytes < resumed.needed_bytes // 2
            assert resumed.files.slice.read_bytes() == reference(published, layers, tmp_path)


async def test_without_a_swarm_certificate_nothing_is_fetched(published: Published, tmp_path: Path) -> None:
    async with running_tracker(tmp_path) as tracker:
        with seeders(tmp_path, tracker, published.directory) as children:
            await wait_for_holders(tracker.address, MODEL_ID, 1, tracker.security)
            seeder = SeedLine.read(children[0].ready).address  # type: ignore[arg-type]
            entry = published.manifest.of_kind("layer")[0]
            config = FetchConfig(MODEL_ID, LayerRange(0, 2), tracker.address, tmp_path / "intruder")
            with pytest.raises(Unavailable):  # plaintext against the tracker's mTLS port
                await fetch_range(config)
            authority = load_authority(tracker.root)
            ca_only = grpc.ssl_channel_credentials(tracker.security.node.ca_pem)  # trusts the CA, presents nothing
            stranger = LinkSecurity(
                mint_node(create_authority("other", time.time()), node_id="w-x", role="worker", now_unix_s=time.time())
            )
            async with grpc.aio.secure_channel(seeder, ca_only, options=channel_options(ANY_WORKER_NAME)) as raw:
                request = artifact_wire.fetch_to_proto(artifact_wire.FetchRange(entry.sha256, 0, entry.size, 1 << 16))
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    async for _ in services.ArtifactsStub(raw).Fetch(request, timeout=5.0):
                        pass
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # no handshake without a certificate
            for channel in (
                artifact_channel(seeder),  # plaintext
                artifact_channel(seeder, stranger),
                # A swarm certificate, but expecting another holder than the one at that address.
                artifact_channel(seeder, tracker.security, hop_server_name("w-someone-else")),
            ):
                async with channel:
                    with pytest.raises(Unavailable):
                        await fetch_bytes(channel, entry.sha256, 0, entry.size, timeout=5.0)
            # A certificate of the swarm, but of a role that fetches nothing: refused by the verdict.
            tracker_role = LinkSecurity(mint_node(authority, node_id="t-x", role="tracker", now_unix_s=time.time()))
            async with artifact_channel(seeder, tracker_role) as channel:
                with pytest.raises(PermissionDenied):
                    await fetch_bytes(channel, entry.sha256, 0, entry.size)
            async with artifact_channel(seeder, tracker.identity("gw", "gateway")) as channel:
                assert len(await fetch_bytes(channel, entry.sha256, 0, entry.size)) == entry.size
            assert not (tmp_path / "intruder" / "cache").exists()


async def test_a_holder_advertises_only_itself_and_only_as_a_worker(tmp_path: Path) -> None:
    async with running_tracker(tmp_path) as tracker:
        worker = tracker.identity("holder")
        own = Advertisement(worker.identity.node_id, "127.0.0.1:9", frozenset({"ab" * 32}))
        async with TrackerClient(tracker.address, security=worker) as client:
            assert await client.advertise(own) > 0
            with pytest.raises(PermissionDenied, match="may not advertise"):
                await client.advertise(replace(own, holder_id="w-someone-else"))
        async with TrackerClient(tracker.address, security=tracker.identity("gw", "gateway")) as client:
            with pytest.raises(PermissionDenied):
                await client.advertise(replace(own, holder_id="gw"))
            found = await client.find_holders("", ("ab" * 32,))
        assert [h.holder_id for h in found.holders] == [worker.identity.node_id]


async def test_a_holder_behind_nat_is_announced_at_its_relay_and_never_at_its_own_address(tmp_path: Path) -> None:
    """Review item 10d: a worker private by its word announces nothing while no relay carries it
    (peers would be sent to an address nobody can dial), then its relayed address."""
    digest = "cd" * 32
    async with running_tracker(tmp_path) as tracker:
        worker = tracker.identity("holder")
        node_id = worker.identity.node_id
        reach = Reach("10.0.0.5:7000", "private", ("127.0.0.1:7401",))
        own = Advertisement(node_id, reach.direct, frozenset({digest}))
        stop = asyncio.Event()
        async with (
            TrackerClient(tracker.address, security=worker) as client,
            TrackerClient(tracker.address, security=tracker.identity("gw", "gateway")) as asking,
        ):
            announcing = asyncio.create_task(announce_forever(client, own, stop, address=lambda: reach.dialable))
            try:
                await asyncio.sleep(0.5)
                assert (await asking.find_holders("", (digest,))).holders == ()
                reach.moved(f"{node_id}@127.0.0.1:7401")
                for _ in range(100):
                    holders = (await asking.find_holders("", (digest,))).holders
                    if holders:
                        break
                    await asyncio.sleep(0.05)
                assert [holder.address for holder in holders] == [f"{node_id}@127.0.0.1:7401"]
            finally:
                stop.set()
                await asyncio.wait_for(announcing, 5.0)
