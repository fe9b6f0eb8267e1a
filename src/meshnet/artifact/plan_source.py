"""What ``meshnet plan`` reads a model's footprint from, without its weights: a GGUF (whole, a
gguf-split set or a header-only copy), a published manifest (its metadata artifact beside it), or a model id whose
manifest and header a worker fetched into the data dir (``models-by-id/ID``).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from meshnet.artifact.cache import HEADER_ONLY_SUFFIX
from meshnet.artifact.describe import describe_model
from meshnet.artifact.footprint import memory_footprint
from meshnet.artifact.gguf_split import first_part
from meshnet.artifact.manifest_codec import decode_manifest
from meshnet.artifact.model_id import served_model_id
from meshnet.core.errors import InvalidArgument
from meshnet.core.layer_costs import ModelFootprint

MANIFEST_FILE = "manifest.json"
MODELS_BY_ID = "models-by-id"
"""Where a worker fetching by model id keeps its manifest and header (``fetch.fetcher``)."""


@dataclass(frozen=True)
class PlannedModel:
    name: str
    footprint: ModelFootprint
    context_length: int
    """The model's trained context (the largest the planner considers)."""


def planned_model(model: str, data_dir: Path) -> PlannedModel:
    """``model``'s footprint: a GGUF path, a manifest (file or its folder) or a model id."""
    path = Path(model)
    if path.is_file() and path.name != MANIFEST_FILE:
        return _from_header(path, served_model_id(path.name.removesuffix(HEADER_ONLY_SUFFIX)))
    folder = path.parent if path.name == MANIFEST_FILE else path
    if not (folder / MANIFEST_FILE).is_file():
        folder = Path(data_dir) / MODELS_BY_ID / model
    if not (folder / MANIFEST_FILE).is_file() and path.is_dir():
        # A gguf-split set given as its directory, as slice, publish and the workers take it.
        return _from_header(path, served_model_id(first_part(path)))
    if not (folder / MANIFEST_FILE).is_file():
        raise InvalidArgument(
            f"{model} is neither a GGUF file, a manifest nor a model id this data dir holds "
            f"({Path(data_dir) / MODELS_BY_ID} has no such folder)"
        )
    return _from_manifest(folder)


def _from_header(path: Path, name: str) -> PlannedModel:
    return PlannedModel(name, memory_footprint(path), describe_model(path).context_length)


def _from_manifest(folder: Path) -> PlannedModel:
    """The header a fetch kept beside the manifest, else the manifest's metadata artifact (a
    publish folder's ``artifacts/SHA``) laid out as a sparse header-only copy."""
    manifest = decode_manifest((folder / MANIFEST_FILE).read_bytes())
    kept = folder / f"{manifest.source.sha256[:16]}{HEADER_ONLY_SUFFIX}"
    if kept.is_file():
        return _from_header(kept, manifest.model_id)
    header = manifest.of_kind("metadata")[0]
    artifact = folder / "artifacts" / header.sha256
    if not artifact.is_file():
        raise InvalidArgument(
            f"{folder / MANIFEST_FILE} is here but not its header: neither {kept.name} (a fetched "
            f"range keeps it) nor artifacts/{header.sha256[:16]}… (a publish folder holds it)"
        )
    with tempfile.TemporaryDirectory(prefix="meshnet-plan-") as raw:
        copy = Path(raw) / f"header{HEADER_ONLY_SUFFIX}"
        with open(copy, "wb") as handle:
            handle.write(artifact.read_bytes()[: header.size])
            handle.truncate(manifest.source.size)
        return _from_header(copy, manifest.model_id)
