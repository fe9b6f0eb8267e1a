"""The tokenizer artifact: a vocabulary-only GGUF that tokenizes and renders chats exactly as the
whole model does, published in the signed manifest (schema 2); a schema-1 manifest still parses
but a gateway asking it for a tokenizer gets a typed error that names the fix."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from artifact_published import Published, publish_model

from meshnet.artifact.describe import describe_model
from meshnet.artifact.gguf_file import parse_gguf
from meshnet.artifact.manifest import SCHEMA, SCHEMA_V1, ManifestError, TokenizerArtifactMissing
from meshnet.artifact.manifest_codec import decode_manifest, manifest_json, sign_manifest, verify_manifest_signature
from meshnet.artifact.model_id import served_model_id
from meshnet.artifact.publish import artifact_path
from meshnet.artifact.synthetic import FAMILIES, SyntheticSpec
from meshnet.artifact.vocab_only import write_vocab_only
from meshnet.core.errors import ArtifactError
from meshnet.engine.tokenizer import Tokenizer

TEXTS = ["the cat is in a hat", "  leading spaces and\nnewlines\t", "<s> markers </s> stay text", "ünïcödé 🙂 bytes"]
MESSAGES = [
    {"role": "system", "content": "be short"},
    {"role": "user", "content": "is the sea </s> blue?"},
    {"role": "assistant", "content": "it is"},
    {"role": "user", "content": "and the sky"},
]


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, synthetic_model_factory: Any) -> Published:
    return publish_model(synthetic_model_factory(SyntheticSpec()), tmp_path_factory.mktemp("tokenizer-artifact"))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_vocabulary_only_file_tokenizes_as_the_whole_model(
    family: str, synthetic_model_factory: Any, tmp_path: Path
) -> None:
    source = synthetic_model_factory(SyntheticSpec(architecture=family))
    vocab = write_vocab_only(parse_gguf(source), tmp_path / "vocab.gguf")
    assert parse_gguf(vocab).tensors == {} and vocab.stat().st_size < source.stat().st_size
    whole, alone = Tokenizer(describe_model(source)), Tokenizer(describe_model(vocab))
    try:
        for text in TEXTS:
            for special in (True, False):
                assert alone.encode(text, add_special=special) == whole.encode(text, add_special=special)
        assert alone.encode_chat(MESSAGES) == whole.encode_chat(MESSAGES)
        assert alone.apply_chat_template(MESSAGES) == whole.apply_chat_template(MESSAGES)
        assert alone.eos_token_ids == whole.eos_token_ids and alone.control_ids == whole.control_ids
        assert [alone.token_bytes(t) for t in range(alone.n_vocab)] == [
            whole.token_bytes(t) for t in range(whole.n_vocab)
        ]
    finally:
        whole.close()
        alone.close()


def test_a_source_without_a_vocabulary_has_no_tokenizer_to_publish(tiny_model: Path, tmp_path: Path) -> None:
    from meshnet.artifact.slicing import write_slice
    from meshnet.core.layers import LayerRange

    head = tmp_path / "head.gguf"
    write_slice(tiny_model, LayerRange(0, 2), head)  # a head slice carries no vocabulary
    with pytest.raises(ArtifactError, match="no tokenizer"):
        write_vocab_only(parse_gguf(head), tmp_path / "vocab.gguf")


def test_publish_lists_the_vocabulary_only_file_as_a_signed_artifact(published: Published, tmp_path: Path) -> None:
    manifest = published.manifest
    assert manifest.schema == SCHEMA and verify_manifest_signature(manifest)
    entry = manifest.tokenizer()
    assert entry.kind == "tokenizer" and entry.tensors == () and entry.layer is None
    stored = artifact_path(published.directory, entry.sha256)
    expected = write_vocab_only(parse_gguf(published.source), tmp_path / "again.gguf")
    assert stored.read_bytes() == expected.read_bytes()  # content-addressed: the same source, the same bytes
    assert parse_gguf(stored).metadata.keys() == parse_gguf(published.source).metadata.keys()


def _tokenizer_of(document: dict[str, Any]) -> dict[str, Any]:
    return next(a for a in document["artifacts"] if a["kind"] == "tokenizer")


def _document(published: Published) -> dict[str, Any]:
    return json.loads((published.directory / "manifest.json").read_bytes())


def test_a_schema_1_manifest_parses_and_refuses_a_gateway_with_the_fix(published: Published) -> None:
    old = replace(
        published.manifest,
        schema=SCHEMA_V1,
        artifacts=tuple(e for e in published.manifest.artifacts if e.kind != "tokenizer"),
    )
    parsed = decode_manifest(manifest_json(sign_manifest(old, published.key)))
    assert parsed.schema == SCHEMA_V1 and verify_manifest_signature(parsed)
    with pytest.raises(TokenizerArtifactMissing, match=r"republish .* --model"):
        parsed.tokenizer()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema=SCHEMA_V1), "at most 0 tokenizer"),
        (
            lambda d: d["artifacts"].append(dict(next(a for a in d["artifacts"] if a["kind"] == "tokenizer"))),
            "twice|at most 1",
        ),
        (lambda d: d.update(schema="meshnet.manifest/3"), "is not one of"),
    ],
)
def test_tokenizer_artifacts_beyond_the_schema_are_refused(published: Published, mutate: Any, message: str) -> None:
    document = _document(published)
    mutate(document)
    with pytest.raises(ManifestError, match=message):
        decode_manifest(json.dumps(document))


@pytest.mark.parametrize(
    "source, published_name, served",
    [
        ("/m/SmolLM2-135M-Instruct.Q4_1.gguf", None, "SmolLM2-135M-Instruct.Q4_1"),
        ("/m/SmolLM2-135M-Instruct.Q4_1.gguf", "smol", "smol"),
        ("/m/my model (v2).gguf", None, "my-model-v2"),
        ("/m/---.gguf", None, "model"),
    ],
)
def test_the_served_model_id_is_the_published_name_else_the_stem(
    source: str, published_name: str | None, served: str
) -> None:
    assert served_model_id(Path(source), published_name) == served


def test_a_local_file_is_described_under_its_served_id(tiny_model: Path) -> None:
    assert describe_model(tiny_model).name == served_model_id(tiny_model) == tiny_model.stem


def test_the_first_part_of_a_split_set_gives_a_whole_vocabulary_file(tiny_model: Path, tmp_path: Path) -> None:
    from meshnet.artifact.gguf_file import MetadataValue, ValueType

    source = parse_gguf(tiny_model)
    # What gguf-split writes into every part: kept, llama.cpp would go looking for parts 2 and 3.
    split = {
        "split.no": MetadataValue(ValueType.UINT16, 0),
        "split.count": MetadataValue(ValueType.UINT16, 3),
        "split.tensors.count": MetadataValue(ValueType.INT32, len(source.tensors)),
    }
    first_part = replace(source, metadata={**source.metadata, **split})
    vocab = write_vocab_only(first_part, tmp_path / "model-00001-of-00003.gguf")
    assert not [key for key in parse_gguf(vocab).metadata if key.startswith("split.")]
    whole, alone = Tokenizer(describe_model(tiny_model)), Tokenizer(describe_model(vocab))
    try:
        assert alone.encode_chat(MESSAGES) == whole.encode_chat(MESSAGES)
    finally:
        whole.close()
        alone.close()
