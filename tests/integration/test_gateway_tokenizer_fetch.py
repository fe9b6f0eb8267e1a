"""A gateway's tokenizer by model id, from seeder processes over loopback gRPC: only the tokenizer
artifact is fetched, verified against the signed manifest; a rerun keeps the verified file; an
untrusted publisher and a schema-1 manifest (published before the tokenizer artifact) are typed
refusals, never a gateway that tokenizes with unsigned bytes."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "artifact"))
from artifact_harness import running_tracker, seeders, wait_for_holders
from artifact_published import Published, publish_model

from meshnet.artifact.manifest import SCHEMA_V1, TokenizerArtifactMissing
from meshnet.artifact.manifest_codec import manifest_json, sign_manifest
from meshnet.artifact.publish import MANIFEST_NAME, artifact_path
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.artifact.trust import UntrustedPublisher
from meshnet.fetch.fetcher import ManifestWanted
from meshnet.fetch.tokenizer import fetch_tokenizer

pytestmark = pytest.mark.timeout(120)
MODEL_ID = "tiny-tok"


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, synthetic_model_factory: Any) -> Published:
    source = synthetic_model_factory(SyntheticSpec(n_layers=4))
    return publish_model(source, tmp_path_factory.mktemp("tokenizer-published"), MODEL_ID)


async def test_only_the_tokenizer_artifact_is_fetched_and_verified(published: Published, tmp_path: Path) -> None:
    entry = published.manifest.tokenizer()
    manifest_size = (published.directory / MANIFEST_NAME).stat().st_size
    async with running_tracker(tmp_path) as tracker:
        with seeders(tmp_path, tracker, published.directory):
            await wait_for_holders(tracker.address, MODEL_ID, 1, tracker.security)
            home = tmp_path / "gateway"
            fetched = await fetch_tokenizer(ManifestWanted(MODEL_ID, home), tracker.address, tracker.security)
            assert fetched.path.read_bytes() == artifact_path(published.directory, entry.sha256).read_bytes()
            assert fetched.fetched_bytes == manifest_size + entry.size
            assert fetched.manifest == published.manifest
            files = [p for p in home.rglob("*") if p.is_file()]
            assert [p for p in files if p.suffix == ".gguf"] == [fetched.path]
            assert not [p for p in files if "partial" in p.name]
            # A rerun keeps the verified file: only the manifest crosses the wire again.
            again = await fetch_tokenizer(ManifestWanted(MODEL_ID, home), tracker.address, tracker.security)
            assert again.path == fetched.path and again.fetched_bytes == manifest_size
            # A damaged file is fetched again rather than trusted.
            fetched.path.write_bytes(b"\0" * entry.size)
            mended = await fetch_tokenizer(ManifestWanted(MODEL_ID, home), tracker.address, tracker.security)
            assert mended.path.read_bytes() == artifact_path(published.directory, entry.sha256).read_bytes()
            with pytest.raises(UntrustedPublisher):
                await fetch_tokenizer(
                    ManifestWanted(MODEL_ID, tmp_path / "other", trust_publisher="0" * 64),
                    tracker.address,
                    tracker.security,
                )


async def test_a_schema_1_manifest_gives_the_gateway_a_typed_error(published: Published, tmp_path: Path) -> None:
    old = tmp_path / "old-published"
    shutil.copytree(published.directory, old)
    manifest = published.manifest
    tokenizer = manifest.tokenizer()
    artifacts = tuple(e for e in manifest.artifacts if e.kind != "tokenizer")
    (old / MANIFEST_NAME).write_bytes(
        manifest_json(sign_manifest(replace(manifest, schema=SCHEMA_V1, artifacts=artifacts), published.key))
    )
    artifact_path(old, tokenizer.sha256).unlink()
    async with running_tracker(tmp_path) as tracker:
        with seeders(tmp_path, tracker, old):
            await wait_for_holders(tracker.address, MODEL_ID, 1, tracker.security)
            with pytest.raises(TokenizerArtifactMissing, match="republish"):
                await fetch_tokenizer(ManifestWanted(MODEL_ID, tmp_path / "gateway"), tracker.address, tracker.security)
