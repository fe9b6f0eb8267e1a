"""The tokenizer on the synthetic model's SentencePiece-style vocabulary and chat template."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.artifact import synthetic
from meshnet.artifact.describe import describe_model
from meshnet.artifact.slicing import write_slice
from meshnet.core.errors import ArtifactError, InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.engine.tokenizer import Tokenizer

BYTE_BASE = 3  # <0x00> follows <unk>, <s>, </s>
EURO = [BYTE_BASE + b for b in "€".encode()]  # <0xE2> <0x82> <0xAC>


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Iterator[Tokenizer]:
    loaded = Tokenizer(describe_model(tiny_model))
    yield loaded
    loaded.close()


@pytest.mark.parametrize("text", ["the cat is a dog", "hello world", "Hello, World!", "a  b\tc\nd", "price: 5 €, 日本"])
def test_encode_decode_round_trip(tokenizer: Tokenizer, text: str) -> None:
    tokens = tokenizer.encode(text, add_special=False)
    assert tokens and all(3 <= t < tokenizer.n_vocab for t in tokens)
    # SentencePiece marks the start of text as a word boundary: one leading space comes back.
    assert tokenizer.decode(tokens) == " " + text


def test_encode_adds_bos_only_when_asked(tokenizer: Tokenizer) -> None:
    plain = tokenizer.encode("the", add_special=False)
    assert tokenizer.encode("the", add_special=True) == [1, *plain]


def test_pieces_and_byte_fallback(tokenizer: Tokenizer) -> None:
    assert tokenizer.n_vocab == 293
    assert tokenizer.eos_token_ids == frozenset({2})
    assert tokenizer.token_bytes(BYTE_BASE + 0x41) == b"A"
    assert [tokenizer.token_bytes(t) for t in EURO] == [b"\xe2", b"\x82", b"\xac"]
    assert tokenizer.encode("€", add_special=False)[-3:] == EURO
    for bad in (-1, tokenizer.n_vocab):
        with pytest.raises(InvalidArgument, match="outside the vocabulary"):
            tokenizer.token_bytes(bad)


def test_incremental_decoder_holds_back_partial_utf8(tokenizer: Tokenizer) -> None:
    decoder = tokenizer.new_decoder()
    hello = tokenizer.encode("hi", add_special=False)
    assert "".join(decoder.push(t) for t in hello) == " hi"
    assert [decoder.push(t) for t in EURO] == ["", "", "€"]
    assert decoder.push(BYTE_BASE + ord("!")) == "!"
    assert decoder.flush() == ""


def test_incremental_decoder_flushes_an_unfinished_character_as_replacement(tokenizer: Tokenizer) -> None:
    decoder = tokenizer.new_decoder()
    assert decoder.push(EURO[0]) == decoder.push(EURO[1]) == ""
    assert decoder.flush() == "\ufffd"


def test_chat_template_renders(tokenizer: Tokenizer) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages) == "<|system|>be brief</s><|user|>hi</s><|assistant|>"
    assert (
        tokenizer.apply_chat_template(messages, add_generation_prompt=False) == "<|system|>be brief</s><|user|>hi</s>"
    )


def test_a_head_slice_has_no_tokenizer(tiny_model: Path, tmp_path: Path) -> None:
    head = tmp_path / "head.gguf"
    write_slice(tiny_model, LayerRange(0, 2), head)
    with pytest.raises(ArtifactError, match="carries no tokenizer"):
        Tokenizer(describe_model(head))


def _model_with_template(template: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    spec = synthetic.SyntheticSpec(n_layers=1, chat_template=template)
    return synthetic.write_synthetic_model(folder / "templated.gguf", spec)


def test_template_code_runs_sandboxed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    loaded = Tokenizer(describe_model(_model_with_template(escape, tmp_path, monkeypatch)))
    try:
        with pytest.raises(InvalidArgument, match="chat template rejected"):
            loaded.apply_chat_template([{"role": "user", "content": "x"}])
    finally:
        loaded.close()


def test_template_raise_exception_is_invalid_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}ok"
    loaded = Tokenizer(describe_model(_model_with_template(template, tmp_path, monkeypatch)))
    try:
        assert loaded.apply_chat_template([{"role": "user", "content": "x"}]) == "ok"
        with pytest.raises(InvalidArgument, match="user first"):
            loaded.apply_chat_template([{"role": "assistant", "content": "x"}])
    finally:
        loaded.close()
