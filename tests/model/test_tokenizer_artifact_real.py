"""The tokenizer artifact of the real models: SmolLM2's and Gemma 3's vocabulary-only GGUFs,
loaded through llama.cpp ``vocab_only``, give the whole file's token ids, control markers and
rendered chats (Gemma 3 is a base model: with a --chat-template), at a few percent of its size.

Needs MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 and both provisioned models.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshnet.artifact.gguf_file import parse_gguf
from meshnet.artifact.provision import DEFAULT_MODEL, GEMMA3_270M, model_path
from meshnet.artifact.vocab_only import write_vocab_only

DATA_DIR = Path(os.environ.get("MESHNET_DATA_DIR", Path(__file__).resolve().parents[2] / ".data"))
ENABLED = os.environ.get("MESHNET_ENABLE_REAL_INFERENCE_TESTS") == "1"
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}<start_of_turn>model\n"
)
TEXTS = [
    "Hello, world! Numbers 12345 and ünïcödé 🙂.",
    "  two leading spaces\n\ttab and newline",
    "<|im_start|>user markers in text stay text<|im_end|> <start_of_turn> <eos>",
    "def f(x):\n    return x ** 2  # code",
]
MESSAGES = [
    {"role": "system", "content": "You answer in one line."},
    {"role": "user", "content": "What is <|im_end|> or <end_of_turn> here?"},
    {"role": "assistant", "content": "Plain text."},
    {"role": "user", "content": "Name three colours, ünïcödé 🙂."},
]

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(not ENABLED, reason="set MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 to run real-model tests"),
]


@pytest.mark.parametrize(("package", "template"), [(DEFAULT_MODEL, None), (GEMMA3_270M, GEMMA_TEMPLATE)])
def test_the_vocabulary_only_file_equals_the_whole_model(package: object, template: str | None, tmp_path: Path) -> None:
    from meshnet.artifact.describe import describe_model
    from meshnet.engine.tokenizer import Tokenizer

    source = model_path(DATA_DIR / "models", package)  # type: ignore[arg-type]
    if not source.exists():
        pytest.skip(f"{source} is not provisioned (meshnet provision)")
    vocab = write_vocab_only(parse_gguf(source), tmp_path / "vocab.gguf")
    assert vocab.stat().st_size < source.stat().st_size // 10
    whole = Tokenizer(describe_model(source), chat_template=template)
    alone = Tokenizer(describe_model(vocab), chat_template=template)
    try:
        for text in TEXTS:
            for special in (True, False):
                assert alone.encode(text, add_special=special) == whole.encode(text, add_special=special)
        assert alone.apply_chat_template(MESSAGES) == whole.apply_chat_template(MESSAGES)
        assert alone.encode_chat(MESSAGES) == whole.encode_chat(MESSAGES)
        assert alone.eos_token_ids == whole.eos_token_ids and alone.control_ids == whole.control_ids
        every = range(whole.n_vocab)
        assert alone.n_vocab == whole.n_vocab
        assert [alone.token_bytes(t) for t in every] == [whole.token_bytes(t) for t in every]
        assert describe_model(vocab).context_length == describe_model(source).context_length
    finally:
        whole.close()
        alone.close()


GEMMA_TURNS_TEMPLATE = (  # Gemma's own turn format: assistant is "model", content trimmed
    "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
PREFILLED = [*MESSAGES, {"role": "assistant", "content": "Red, green and"}]


@pytest.mark.parametrize(
    ("package", "template", "opening"),
    [(DEFAULT_MODEL, None, "<|im_start|>assistant\n"), (GEMMA3_270M, GEMMA_TURNS_TEMPLATE, "<start_of_turn>model\n")],
)
def test_a_trailing_assistant_message_is_continued_inside_its_turn(
    package: object, template: str | None, opening: str
) -> None:
    """Assistant prefill with the real vocabularies and templates: the prompt is the reply's
    opening plus the message, ending without an end-of-turn; its markers are control tokens."""
    from meshnet.artifact.describe import describe_model
    from meshnet.engine.tokenizer import Tokenizer

    source = model_path(DATA_DIR / "models", package)  # type: ignore[arg-type]
    if not source.exists():
        pytest.skip(f"{source} is not provisioned (meshnet provision)")
    tokenizer = Tokenizer(describe_model(source), chat_template=template)
    try:
        tokens = tokenizer.encode_chat_continuation(PREFILLED)
        opened = tokenizer.encode_chat(MESSAGES, add_generation_prompt=True)
        assert tokens[: len(opened)] == opened  # the generation prompt's own tokens, markers included
        assert tokenizer.apply_chat_template(MESSAGES).endswith(opening)
        assert tokens[len(opened) :] == tokenizer.encode("Red, green and", add_special=False)
    finally:
        tokenizer.close()


def test_a_template_whose_assistant_turn_differs_from_its_reply_opening_is_refused() -> None:
    """The tests' Gemma template opens every reply as "model" but writes an assistant message's
    turn as "assistant": a continuation cannot be expressed, so it is refused, not guessed."""
    from meshnet.artifact.describe import describe_model
    from meshnet.core.errors import InvalidArgument
    from meshnet.engine.tokenizer import Tokenizer

    source = model_path(DATA_DIR / "models", GEMMA3_270M)
    if not source.exists():
        pytest.skip(f"{source} is not provisioned (meshnet provision)")
    tokenizer = Tokenizer(describe_model(source), chat_template=GEMMA_TEMPLATE)
    try:
        with pytest.raises(InvalidArgument, match="cannot be continued"):
            tokenizer.encode_chat_continuation(PREFILLED)
    finally:
        tokenizer.close()
