"""A published gguf-split set fetched by model id from a seeder process: a node fetches only
its range's artifacts and gets the slice ``meshnet slice`` cuts from the set."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "artifact"))
from artifact_harness import running_tracker, seeders, wait_for_holders
from artifact_published import publish_model
from artifact_split import write_split_set

from meshnet.artifact.gguf_split import model_sha256, open_model
from meshnet.artifact.manifest import needed_artifacts
from meshnet.artifact.slicing import write_slice
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.layers import LayerRange
from meshnet.fetch.fetcher import FetchConfig, fetch_range

pytestmark = pytest.mark.timeout(120)
MODEL_ID = "tiny-split"


async def test_a_range_of_a_published_set_fetches_only_its_artifacts(
    synthetic_model_factory: Any, tmp_path: Path
) -> None:
    unsplit = synthetic_model_factory(SyntheticSpec(n_layers=6, n_embd=128, n_ff=256))
    parts = write_split_set(unsplit, tmp_path / "set", max_tensors=12)
    published = publish_model(parts[0], tmp_path / "pub", MODEL_ID)
    assert published.manifest.source.sha256 == model_sha256(open_model(parts[0]))
    layers = LayerRange(2, 4)
    async with running_tracker(tmp_path / "tracker") as tracker:
        with seeders(tmp_path, tracker, published.directory):
            await wait_for_holders(tracker.address, MODEL_ID, 1, tracker.security)
            config = FetchConfig(MODEL_ID, layers, tracker.address, tmp_path / "node")
            fetched = await fetch_range(config, security=tracker.security)
    reference = tmp_path / "reference.gguf"
    write_slice(parts[0], layers, reference)
    assert fetched.files.slice.read_bytes() == reference.read_bytes()
    needed = needed_artifacts(published.manifest, layers)
    assert fetched.needed_bytes == sum(e.size for e in needed)
    assert fetched.needed_bytes < sum(e.size for e in published.manifest.artifacts) / 2
