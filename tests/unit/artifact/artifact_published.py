"""A published synthetic model shared by the artifact-plane tests (read-only: copy to damage)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meshnet.artifact.manifest import Manifest
from meshnet.artifact.publish import PublishOptions, publish
from meshnet.security.signing import PublisherKey, load_or_create_key


@dataclass(frozen=True)
class Published:
    source: Path
    directory: Path
    manifest: Manifest
    key: PublisherKey


def publish_model(source: Path, folder: Path, model_id: str = "tiny-llama", piece_size: int = 1 << 12) -> Published:
    """Publish ``source`` under ``folder`` with small pieces, so even tiny artifacts span several."""
    key, _ = load_or_create_key(folder / "publisher.key")
    options = PublishOptions(model_id, "apache-2.0", repo="synthetic", revision="0", piece_size=piece_size)
    manifest = publish(source, folder / "published", options, key)
    return Published(source, folder / "published", manifest, key)
