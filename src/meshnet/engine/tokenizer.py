"""Text <-> tokens for one model, with llama.cpp's own tokenizer and the GGUF's chat template.

The tokenizer is loaded ``vocab_only`` (no tensors), so a gateway can hold it for a model it
does not run. The chat template is the Jinja template stored in the GGUF, rendered in a
sandbox: it is data from a file, never trusted code.
"""

from __future__ import annotations

import codecs
import ctypes
from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2
import llama_cpp
from jinja2.sandbox import ImmutableSandboxedEnvironment

from meshnet.artifact.describe import ModelDescription
from meshnet.core.errors import ArtifactError, InvalidArgument
from meshnet.engine import llama_ffi  # noqa: F401 - quiets llama.cpp logging before the load


class IncrementalDecoder:
    """Turns a token stream into text, holding back bytes of an unfinished UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class Tokenizer:
    def __init__(self, model: ModelDescription) -> None:
        model_path = model.path
        self.context_length = model.context_length
        template = model.chat_template
        if not model.has_tokenizer:
            raise ArtifactError(f"{Path(model_path).name} carries no tokenizer")
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), params)
        if not self._model:
            raise ArtifactError(f"llama.cpp could not load the vocabulary of {Path(model_path).name}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self._pieces: dict[int, bytes] = {}
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.eos_token_ids = frozenset(t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t))
        self._bos_text = self._piece_text(llama_cpp.llama_vocab_bos(self._vocab))
        self._eos_text = self._piece_text(llama_cpp.llama_vocab_eos(self._vocab))
        self._template = None
        if isinstance(template, str):
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
            env.globals["raise_exception"] = _raise_template_error
            self._template = env.from_string(template)

    def _piece_text(self, token: int) -> str:
        return self.token_bytes(token).decode("utf-8", errors="replace") if token >= 0 else ""

    def encode(self, text: str, *, add_special: bool) -> list[int]:
        raw = text.encode("utf-8")
        capacity = len(raw) + 16
        while True:
            buffer = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(self._vocab, raw, len(raw), buffer, capacity, add_special, True)
            if count >= 0:
                return list(buffer[:count])
            capacity = -count

    def token_bytes(self, token_id: int) -> bytes:
        cached = self._pieces.get(token_id)
        if cached is not None:
            return cached
        if not 0 <= token_id < self.n_vocab:
            raise InvalidArgument(f"token id {token_id} is outside the vocabulary of {self.n_vocab}")
        buffer = ctypes.create_string_buffer(256)
        count = llama_cpp.llama_token_to_piece(self._vocab, token_id, buffer, 256, 0, False)
        piece = buffer.raw[: max(count, 0)]
        self._pieces[token_id] = piece
        return piece

    def decode(self, token_ids: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in token_ids).decode("utf-8", errors="replace")

    def new_decoder(self) -> IncrementalDecoder:
        return IncrementalDecoder(self)

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> str:
        if self._template is None:
            # No template in the file: plain role-prefixed turns, so chat still works.
            turns = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            return turns + ("assistant: " if add_generation_prompt else "")
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_text,
                eos_token=self._eos_text,
            )
        except jinja2.TemplateError as error:
            raise InvalidArgument(f"the model's chat template rejected these messages: {error}") from None

    def close(self) -> None:
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None


def _raise_template_error(message: str) -> None:
    raise jinja2.TemplateError(message)
