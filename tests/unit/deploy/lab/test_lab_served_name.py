"""The lab's one served name: its gateway and sweep ask for what its workers serve."""

from __future__ import annotations

from pathlib import Path

from meshnet.artifact.publish import PublishOptions, publish
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.deploy.lab.lab import LabConfig
from meshnet.deploy.lab.swarm import served_name
from meshnet.security.signing import load_or_create_key


def test_workers_fetching_by_model_id_and_the_gateway_agree_on_the_published_name(tmp_path: Path) -> None:
    source = write_synthetic_model(tmp_path / "tiny.gguf", SyntheticSpec(n_layers=2, seed=3))
    key, _ = load_or_create_key(tmp_path / "publisher.key")
    publish(source, tmp_path / "published", PublishOptions("tiny-published", "apache-2.0"), key)
    # Workers fetching by model id serve under the manifest's model id, not the file's stem.
    assert served_name(LabConfig(model=source, data_dir=tmp_path, published=tmp_path / "published")) == (
        "tiny-published"
    )
    assert served_name(LabConfig(model=source, data_dir=tmp_path)) == "tiny"
    named = LabConfig(model=source, data_dir=tmp_path, published=tmp_path / "published", model_name="given")
    assert served_name(named) == "given"
