"""Manifests: canonical round trip, Ed25519 signatures that fail on any changed field, publisher
key files, and a strict parser that turns every malformed document into a ManifestError."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from artifact_published import Published, publish_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshnet.artifact.manifest import ManifestError, needed_artifacts
from meshnet.artifact.manifest_codec import (
    decode_manifest,
    encode_manifest,
    manifest_json,
    sign_manifest,
    verify_manifest_signature,
)
from meshnet.core.layers import LayerRange
from meshnet.security.signing import PublisherKeyError, SignatureInvalid, load_key, load_or_create_key


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, synthetic_model_factory: Any) -> Published:
    from meshnet.artifact.synthetic import SyntheticSpec

    source = synthetic_model_factory(SyntheticSpec())
    return publish_model(source, tmp_path_factory.mktemp("manifest"))


def test_the_file_parses_back_to_the_signed_manifest(published: Published) -> None:
    data = (published.directory / "manifest.json").read_bytes()
    parsed = decode_manifest(data)
    assert parsed == published.manifest
    assert manifest_json(parsed) == data
    assert verify_manifest_signature(parsed) == published.key.fingerprint
    assert parsed.tensor_layers()["blk.2.attn_q.weight"] == 2
    assert parsed.tensor_layers()["token_embd.weight"] == "token_embedding"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("license",), "proprietary"),
        (("model_id",), "other-model"),
        (("context_cap",), 4096),
        (("source", "sha256"), "0" * 64),
        (("kv_format", "type_k"), "q8_0"),
        (("artifacts", 1, "tensors", 0, "name"), "blk.0.renamed.weight"),
        (("artifacts", 3, "sha256"), "f" * 64),
    ],
)
def test_a_changed_field_fails_the_signature(published: Published, path: tuple[Any, ...], value: Any) -> None:
    document = json.loads((published.directory / "manifest.json").read_bytes())
    target = document
    for step in path[:-1]:
        target = target[step]
    assert target[path[-1]] != value
    target[path[-1]] = value
    changed = decode_manifest(json.dumps(document))  # still a well-formed manifest
    with pytest.raises(SignatureInvalid):
        verify_manifest_signature(changed)


def test_a_manifest_resigned_by_another_key_verifies_under_that_key_only(published: Published, tmp_path: Path) -> None:
    other, created = load_or_create_key(tmp_path / "other.key")
    assert created and other.fingerprint != published.key.fingerprint
    resigned = sign_manifest(published.manifest, other)
    assert verify_manifest_signature(resigned) == other.fingerprint
    unsigned = decode_manifest(json.dumps({**encode_manifest(published.manifest), "signature": None}))
    with pytest.raises(ManifestError, match="not signed"):
        verify_manifest_signature(unsigned)


def test_publisher_keys_are_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "publisher.key"
    key, created = load_or_create_key(path)
    assert created and (path.stat().st_mode & 0o777) == 0o600
    again, created_again = load_or_create_key(path)
    assert not created_again and again.fingerprint == key.fingerprint
    os.chmod(path, 0o644)
    with pytest.raises(PublisherKeyError, match="readable by others"):
        load_key(path)
    path.write_bytes(b"not a key")
    os.chmod(path, 0o600)
    with pytest.raises(PublisherKeyError, match="not an unencrypted PEM"):
        load_key(path)


def test_needed_artifacts_follow_the_role(published: Published) -> None:
    manifest = published.manifest
    kinds = {r: sorted(e.kind for e in needed_artifacts(manifest, LayerRange.parse(r))) for r in ("0:2", "1:3", "2:4")}
    assert kinds["0:2"] == ["layer", "layer", "metadata", "token_embedding"]
    assert kinds["1:3"] == ["layer", "layer", "metadata"]
    assert kinds["2:4"] == ["layer", "layer", "metadata", "output", "token_embedding"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema="meshnet.manifest/0"), "schema"),
        (lambda d: d.update(extra=1), "unknown members"),
        (lambda d: d.pop("license"), "license is missing"),
        (lambda d: d.update(context_cap=2048.0), "only integers"),
        (lambda d: d.update(n_layers=True), "n_layers"),
        (lambda d: d["artifacts"][1]["pieces"].reverse(), "merkle_root|piece"),
        (lambda d: d["artifacts"][1].update(size=d["artifacts"][1]["size"] + 1), "size|piece"),
        (lambda d: d["artifacts"].pop(2), "one layer artifact"),
        (lambda d: d["artifacts"].append(d["artifacts"][1]), "one layer artifact|twice"),
        (lambda d: d.update(model_id="../../etc"), "model_id"),
    ],
)
def test_malformed_manifests_name_the_field(published: Published, mutate: Any, message: str) -> None:
    document = copy.deepcopy(encode_manifest(published.manifest))
    mutate(document)
    with pytest.raises(ManifestError, match=message):
        decode_manifest(json.dumps(document))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:3]):
            found += _paths(item, (*prefix, index))
    return found


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_mutations_of_a_real_manifest_give_typed_errors(published: Published, data: st.DataObject) -> None:
    document = copy.deepcopy(encode_manifest(published.manifest))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(document)))
        target = document
        for step in path[:-1]:
            target = target[step]
        if data.draw(st.booleans()) and isinstance(target, dict):
            target.pop(path[-1], None)
        else:
            target[path[-1]] = data.draw(_JSON)
    try:
        parsed = decode_manifest(json.dumps(document))
    except ManifestError:
        return
    # A mutation that still parses must either be a no-op or fail the signature: never both pass.
    if parsed != published.manifest:
        with pytest.raises((SignatureInvalid, ManifestError)):
            verify_manifest_signature(parsed)


@settings(max_examples=1000, deadline=None)
@given(raw=st.binary(max_size=200) | _JSON.map(lambda v: json.dumps(v).encode()))
def test_fuzzed_documents_give_typed_errors(raw: bytes) -> None:
    with pytest.raises(ManifestError):
        decode_manifest(raw)
