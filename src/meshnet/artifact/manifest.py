"""The model manifest: one signed, versioned document that says what a published model is made of.

A publisher cuts a source GGUF into content-addressed artifacts (``publish.py``): the source
header (``metadata``), one artifact per transformer block (``layer``), the tensors every slice
carries (``global``), the token embedding table (``token_embedding``), the output norm and
LM head (``output``), and (schema 2) the tokenizer: a vocabulary-only GGUF of the source's
metadata (``tokenizer``, ``vocab_only.py``) that a gateway serves from without any weights.
The manifest lists each with its size, sha256, the sha256 of every ``piece_size`` piece and the
Merkle root over them (``pieces.py``), and which tensors it holds, in order, so a node can
fetch only what its layer range needs and check every piece.

The manifest is signed with the publisher's Ed25519 key over its canonical JSON without the
``signature`` member; ``manifest_codec.py`` encodes, parses strictly, signs and verifies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from meshnet.core.errors import ArtifactError
from meshnet.core.layers import LayerRange
from meshnet.security.signing import fingerprint

SCHEMA_V1 = "meshnet.manifest/1"
"""Manifests before the tokenizer artifact: still parsed and served, but a gateway cannot use them."""
SCHEMA = "meshnet.manifest/2"
"""What ``publish`` writes: schema 1 plus at most one ``tokenizer`` artifact."""
SCHEMAS = (SCHEMA_V1, SCHEMA)
ArtifactKind = Literal["metadata", "layer", "global", "token_embedding", "output", "tokenizer"]
ARTIFACT_KINDS: tuple[str, ...] = ("metadata", "layer", "global", "token_embedding", "output", "tokenizer")
TENSORLESS_KINDS = ("metadata", "tokenizer")
"""Artifacts that are GGUF bytes of their own (a header, a vocabulary-only file), not packed tensors."""


class ManifestError(ArtifactError):
    """A manifest that is not valid JSON, misses or mistypes a field, or contradicts itself."""

    code = "manifest_invalid"


class TokenizerArtifactMissing(ArtifactError):
    """The manifest lists no tokenizer artifact (a schema-1 manifest, or a source without a
    vocabulary), so a gateway cannot be served from it by model id."""

    code = "tokenizer_artifact_missing"


@dataclass(frozen=True)
class TensorEntry:
    """One tensor's bytes inside an artifact: ``nbytes`` at ``offset`` (artifacts pack tensors
    back to back in source order, without padding)."""

    name: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ArtifactEntry:
    kind: ArtifactKind
    layer: int | None
    """The block index for ``layer`` artifacts, None for the shared parts."""
    size: int
    sha256: str
    piece_size: int
    pieces: tuple[str, ...]
    merkle_root: str
    tensors: tuple[TensorEntry, ...]


@dataclass(frozen=True)
class SourceInfo:
    file_name: str
    repo: str
    """Upstream repository the GGUF came from (free text, e.g. a hub id or a package name)."""
    revision: str
    sha256: str
    size: int


@dataclass(frozen=True)
class KvFormat:
    """What a node's KV cache for this model looks like, so peers agree before exchanging state."""

    layout: str
    type_k: str
    type_v: str
    head_count_kv: int
    key_length: int
    value_length: int


@dataclass(frozen=True)
class Signature:
    algorithm: str
    public_key: str
    """Hex of the raw 32-byte Ed25519 public key."""
    value: str
    """Hex of the 64-byte signature over the canonical JSON without this member."""

    @property
    def fingerprint(self) -> str:
        return fingerprint(bytes.fromhex(self.public_key))


@dataclass(frozen=True)
class Manifest:
    schema: str
    model_id: str
    model_version: str
    source: SourceInfo
    license: str
    architecture: str
    adapter: str
    quantization: str
    n_layers: int
    n_embd: int
    tokenizer_model: str
    tokenizer_sha256: str
    """sha256 over the source's ``tokenizer.*`` metadata (``publish.tokenizer_digest``)."""
    runtime_backends: tuple[str, ...]
    context_cap: int
    kv_format: KvFormat
    artifacts: tuple[ArtifactEntry, ...]
    signature: Signature | None = None

    def artifact(self, sha256: str) -> ArtifactEntry:
        for entry in self.artifacts:
            if entry.sha256 == sha256:
                return entry
        raise ManifestError(f"manifest {self.model_id} lists no artifact {sha256[:16]}…")

    def of_kind(self, kind: ArtifactKind) -> tuple[ArtifactEntry, ...]:
        return tuple(entry for entry in self.artifacts if entry.kind == kind)

    def tensor_layers(self) -> dict[str, int | str]:
        """The tensor -> layer map: a block index, or the kind of shared artifact holding it."""
        return {t.name: (e.layer if e.layer is not None else e.kind) for e in self.artifacts for t in e.tensors}

    def tokenizer(self) -> ArtifactEntry:
        """The vocabulary-only GGUF a gateway serves from, or a typed error naming the fix."""
        found = self.of_kind("tokenizer")
        if not found:
            raise TokenizerArtifactMissing(
                f"manifest of {self.model_id} ({self.schema}) has no tokenizer artifact: republish the model "
                "with this meshnet (`meshnet publish`), or give the gateway the model file with --model"
            )
        return found[0]

    @property
    def publisher(self) -> str | None:
        return None if self.signature is None else self.signature.fingerprint


def needed_artifacts(manifest: Manifest, layers: LayerRange) -> tuple[ArtifactEntry, ...]:
    """What a node serving ``layers`` must hold: the header, its blocks, the global tensors, the
    token table for a head (its embedding file) or a tail (llama.cpp wants it loaded), and the
    output norm / LM head for a tail."""
    layers.check_within(manifest.n_layers)
    wanted: list[ArtifactEntry] = [*manifest.of_kind("metadata"), *manifest.of_kind("global")]
    wanted += [e for e in manifest.of_kind("layer") if e.layer is not None and e.layer in layers]
    if layers.is_head() or layers.is_tail(manifest.n_layers):
        wanted += manifest.of_kind("token_embedding")
    if layers.is_tail(manifest.n_layers):
        wanted += manifest.of_kind("output")
    return tuple(wanted)
