"""Manifest JSON: canonical encoding, a strict parser, signing and signature checks.

The parser trusts nothing: every member is required with its exact JSON type, unknown members
are refused, every count is bounded, and the document must agree with itself (piece hashes with
their Merkle root, tensors with artifact sizes, one artifact per layer). Any defect is one
``ManifestError`` naming the field, so fuzzed or hostile input never escapes as another
exception. Because nothing is dropped or defaulted, a parsed manifest re-encodes to exactly the
bytes its publisher signed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar, cast

from meshnet.artifact.manifest import (
    ARTIFACT_KINDS,
    SCHEMA_V1,
    SCHEMAS,
    TENSORLESS_KINDS,
    ArtifactEntry,
    KvFormat,
    Manifest,
    ManifestError,
    Signature,
    SourceInfo,
    TensorEntry,
)
from meshnet.artifact.pieces import merkle_root, piece_count
from meshnet.security.signing import ALGORITHM, PublisherKey, verify_signature

MAX_MANIFEST_BYTES = 64 << 20
MAX_ARTIFACTS = 1 << 16
MAX_PIECES = 1 << 20
MAX_TENSORS = 1 << 12
MAX_TEXT = 1 << 12
MAX_SIZE = 1 << 50
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX128 = re.compile(r"^[0-9a-f]{128}$")
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
T = TypeVar("T")


class _Reader:
    """One JSON object's members, each taken once with its type checked; leftovers are refused."""

    def __init__(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise ManifestError(f"{where} must be a JSON object")
        self.members = dict(value)
        self.where = where

    def take(self, key: str) -> object:
        if key not in self.members:
            raise ManifestError(f"{self.where}.{key} is missing")
        return self.members.pop(key)

    def text(self, key: str, pattern: re.Pattern[str] | None = None) -> str:
        value = self.take(key)
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise ManifestError(f"{self.where}.{key} must be a string of at most {MAX_TEXT} characters")
        if pattern is not None and not pattern.match(value):
            raise ManifestError(f"{self.where}.{key} {value[:80]!r} does not match {pattern.pattern}")
        return value

    def integer(self, key: str, low: int = 0, high: int = MAX_SIZE) -> int:
        value = self.take(key)
        # bool is an int in Python; JSON true is not a number.
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ManifestError(f"{self.where}.{key} must be an integer in {low}..{high}")
        return value

    def items(self, key: str, limit: int) -> list[object]:
        value = self.take(key)
        if not isinstance(value, list) or len(value) > limit:
            raise ManifestError(f"{self.where}.{key} must be a list of at most {limit} items")
        return value

    def done(self) -> None:
        if self.members:
            raise ManifestError(f"{self.where} has unknown members {sorted(map(str, self.members))[:5]}")


def _each(values: list[object], where: str, parse: Callable[[object, str], T]) -> tuple[T, ...]:
    return tuple(parse(value, f"{where}[{index}]") for index, value in enumerate(values))


def _tensor(value: object, where: str) -> TensorEntry:
    reader = _Reader(value, where)
    entry = TensorEntry(reader.text("name"), reader.integer("offset"), reader.integer("nbytes"))
    reader.done()
    return entry


def _artifact(value: object, where: str) -> ArtifactEntry:
    reader = _Reader(value, where)
    kind = reader.text("kind")
    if kind not in ARTIFACT_KINDS:
        raise ManifestError(f"{where}.kind {kind[:40]!r} is not one of {', '.join(ARTIFACT_KINDS)}")
    layer_value = reader.take("layer")
    if layer_value is not None and (not isinstance(layer_value, int) or isinstance(layer_value, bool)):
        raise ManifestError(f"{where}.layer must be an integer or null")
    entry = ArtifactEntry(
        kind=cast(Any, kind),
        layer=layer_value,
        size=reader.integer("size", 1),
        sha256=reader.text("sha256", _HEX64),
        piece_size=reader.integer("piece_size", 1 << 12, 1 << 26),
        pieces=tuple(_hex64(v, f"{where}.pieces") for v in reader.items("pieces", MAX_PIECES)),
        merkle_root=reader.text("merkle_root", _HEX64),
        tensors=_each(reader.items("tensors", MAX_TENSORS), f"{where}.tensors", _tensor),
    )
    reader.done()
    _check_artifact(entry, where)
    return entry


def _hex64(value: object, where: str) -> str:
    if not isinstance(value, str) or not _HEX64.match(value):
        raise ManifestError(f"{where} holds a value that is not 64 lowercase hex digits")
    return value


def _check_artifact(entry: ArtifactEntry, where: str) -> None:
    if entry.piece_size & (entry.piece_size - 1):
        raise ManifestError(f"{where}.piece_size {entry.piece_size} is not a power of two")
    if (entry.kind == "layer") != (entry.layer is not None):
        raise ManifestError(f"{where}: a layer artifact needs a layer index, and only it may have one")
    if len(entry.pieces) != piece_count(entry.size, entry.piece_size):
        raise ManifestError(f"{where}: {len(entry.pieces)} piece hashes for {entry.size} bytes")
    if merkle_root([bytes.fromhex(p) for p in entry.pieces]).hex() != entry.merkle_root:
        raise ManifestError(f"{where}.merkle_root is not the root of its piece hashes")
    if (entry.kind in TENSORLESS_KINDS) != (not entry.tensors):
        raise ManifestError(f"{where}: the metadata and tokenizer artifacts hold no tensors, every other one some")
    offset = 0
    for tensor in entry.tensors:
        if tensor.offset != offset:
            raise ManifestError(f"{where}: tensor {tensor.name[:64]!r} is not packed at offset {offset}")
        offset += tensor.nbytes
    if entry.tensors and offset != entry.size:
        raise ManifestError(f"{where}: its tensors hold {offset} bytes, not its size {entry.size}")


def _source(value: object, where: str) -> SourceInfo:
    reader = _Reader(value, where)
    source = SourceInfo(
        reader.text("file_name"), reader.text("repo"), reader.text("revision"),
        reader.text("sha256", _HEX64), reader.integer("size", 1),
    )  # fmt: skip
    reader.done()
    return source


def _kv_format(value: object, where: str) -> KvFormat:
    reader = _Reader(value, where)
    kv = KvFormat(
        reader.text("layout"), reader.text("type_k"), reader.text("type_v"),
        reader.integer("head_count_kv", 0, 1 << 16), reader.integer("key_length", 0, 1 << 20),
        reader.integer("value_length", 0, 1 << 20),
    )  # fmt: skip
    reader.done()
    return kv


def _signature(value: object, where: str) -> Signature:
    reader = _Reader(value, where)
    signature = Signature(
        reader.text("algorithm", re.compile(f"^{ALGORITHM}$")),
        reader.text("public_key", _HEX64),
        reader.text("value", _HEX128),
    )
    reader.done()
    return signature


def _check_manifest(manifest: Manifest) -> None:
    counts = {kind: len(manifest.of_kind(kind)) for kind in ARTIFACT_KINDS}  # type: ignore[arg-type]
    if counts["metadata"] != 1 or counts["token_embedding"] != 1 or counts["output"] > 1 or counts["global"] > 1:
        raise ManifestError("manifest needs one metadata and one token_embedding artifact, at most one output/global")
    tokenizers = 0 if manifest.schema == SCHEMA_V1 else 1
    if counts["tokenizer"] > tokenizers:
        raise ManifestError(f"a {manifest.schema} manifest holds at most {tokenizers} tokenizer artifact")
    layers = sorted(e.layer for e in manifest.of_kind("layer") if e.layer is not None)
    if layers != list(range(manifest.n_layers)):
        raise ManifestError(f"manifest must hold one layer artifact for each of its {manifest.n_layers} layers")
    digests = [e.sha256 for e in manifest.artifacts]
    names = [t.name for e in manifest.artifacts for t in e.tensors]
    if len(set(digests)) != len(digests) or len(set(names)) != len(names):
        raise ManifestError("manifest lists an artifact or a tensor twice")


def decode_manifest(data: bytes | str) -> Manifest:
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"manifest is {len(data)} bytes, more than the {MAX_MANIFEST_BYTES} allowed")
    try:
        document = json.loads(data, parse_constant=_refuse_constant, parse_float=_refuse_float)
    except (ValueError, RecursionError) as error:
        raise ManifestError(f"manifest is not valid JSON: {str(error)[:120]}") from None
    reader = _Reader(document, "manifest")
    schema = reader.text("schema")
    if schema not in SCHEMAS:
        raise ManifestError(f"manifest schema {schema[:40]!r} is not one of {', '.join(SCHEMAS)}")
    signature = reader.take("signature")
    manifest = Manifest(
        schema=schema,
        model_id=reader.text("model_id", _MODEL_ID),
        model_version=reader.text("model_version"),
        source=_source(reader.take("source"), "manifest.source"),
        license=reader.text("license"),
        architecture=reader.text("architecture"),
        adapter=reader.text("adapter"),
        quantization=reader.text("quantization"),
        n_layers=reader.integer("n_layers", 1, 1 << 12),
        n_embd=reader.integer("n_embd", 1, 1 << 20),
        tokenizer_model=reader.text("tokenizer_model"),
        tokenizer_sha256=reader.text("tokenizer_sha256", _HEX64),
        runtime_backends=_each(reader.items("runtime_backends", 16), "manifest.runtime_backends", _text_item),
        context_cap=reader.integer("context_cap", 1, 1 << 24),
        kv_format=_kv_format(reader.take("kv_format"), "manifest.kv_format"),
        artifacts=_each(reader.items("artifacts", MAX_ARTIFACTS), "manifest.artifacts", _artifact),
        signature=None if signature is None else _signature(signature, "manifest.signature"),
    )
    reader.done()
    _check_manifest(manifest)
    return manifest


def _text_item(value: object, where: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ManifestError(f"{where} holds a value that is not a short string")
    return value


def _refuse_constant(name: str) -> object:
    raise ManifestError(f"manifest holds the non-JSON constant {name}")


def _refuse_float(text: str) -> object:
    # Floats have no single canonical spelling, so a signed document must not hold any.
    raise ManifestError(f"manifest holds the number {text[:40]}; only integers are allowed")


def encode_manifest(manifest: Manifest, *, signed: bool = True) -> dict[str, Any]:
    document: dict[str, Any] = {
        "schema": manifest.schema,
        "model_id": manifest.model_id,
        "model_version": manifest.model_version,
        "source": vars_of(manifest.source),
        "license": manifest.license,
        "architecture": manifest.architecture,
        "adapter": manifest.adapter,
        "quantization": manifest.quantization,
        "n_layers": manifest.n_layers,
        "n_embd": manifest.n_embd,
        "tokenizer_model": manifest.tokenizer_model,
        "tokenizer_sha256": manifest.tokenizer_sha256,
        "runtime_backends": list(manifest.runtime_backends),
        "context_cap": manifest.context_cap,
        "kv_format": vars_of(manifest.kv_format),
        "artifacts": [
            {**vars_of(e), "pieces": list(e.pieces), "tensors": [vars_of(t) for t in e.tensors]}
            for e in manifest.artifacts
        ],
    }
    if signed:
        document["signature"] = None if manifest.signature is None else vars_of(manifest.signature)
    return document


def vars_of(value: object) -> dict[str, Any]:
    return dict(vars(value))


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def signing_bytes(manifest: Manifest) -> bytes:
    return canonical_json(encode_manifest(manifest, signed=False))


def manifest_json(manifest: Manifest) -> bytes:
    """The manifest file's bytes: canonical JSON with the signature, and a newline."""
    return canonical_json(encode_manifest(manifest)) + b"\n"


def sign_manifest(manifest: Manifest, key: PublisherKey) -> Manifest:
    unsigned = replace(manifest, signature=None)
    value = key.sign(signing_bytes(unsigned))
    return replace(unsigned, signature=Signature(ALGORITHM, key.public_key.hex(), value.hex()))


def verify_manifest_signature(manifest: Manifest) -> str:
    """Check the manifest's own signature and return the signer's fingerprint (trust is separate)."""
    if manifest.signature is None:
        raise ManifestError(f"manifest {manifest.model_id} is not signed")
    signature = manifest.signature
    verify_signature(bytes.fromhex(signature.public_key), signing_bytes(manifest), bytes.fromhex(signature.value))
    return signature.fingerprint
