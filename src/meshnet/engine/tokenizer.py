"""Text <-> tokens for one model, with llama.cpp's own tokenizer and the GGUF's chat template.

The tokenizer is loaded ``vocab_only`` (no tensors), so a gateway can hold it for a model it
does not run. Text is always tokenized as text: a control marker such as ``<|im_start|>``
written in a prompt or a message stays characters. Only ``encode_chat`` produces control
tokens, for the markers the chat template itself writes (chat_template.py tells them apart).

``encode_chat`` reproduces what llama.cpp does with ``parse_special``: cut the text at control
markers, tokenize each stretch between them on its own, and put the markers' ids between.
The difference is only which markers count: the template's, never the content's.
"""

from __future__ import annotations

import codecs
import ctypes
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import llama_cpp

from meshnet.artifact.describe import ModelDescription
from meshnet.core.errors import ArtifactError, InvalidArgument
from meshnet.engine import llama_ffi
from meshnet.engine.chat_prefill import continuation_pieces
from meshnet.engine.chat_template import ChatPiece, ChatTemplate


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
    def __init__(self, model: ModelDescription, *, chat_template: str | None = None) -> None:
        """``chat_template`` (Jinja source) replaces the GGUF's own, e.g. for a base model that has none."""
        model_path = model.path
        self.context_length = model.context_length
        self.embedding_width = model.n_embd
        template = chat_template if chat_template is not None else model.chat_template
        if not model.has_tokenizer:
            raise ArtifactError(f"{Path(model_path).name} carries no tokenizer")
        self._model = llama_ffi.load_vocabulary(Path(model_path))
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self._pieces: dict[int, bytes] = {}
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.eos_token_ids = frozenset(t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t))
        self._markers = self._control_markers()
        self._marker_pattern = re.compile("|".join(re.escape(text) for text in sorted(self._markers, key=len)[::-1]))
        self.chat_template_source = template if isinstance(template, str) else None
        self._template = ChatTemplate(
            self.chat_template_source,
            bos_text=self._piece_text(llama_cpp.llama_vocab_bos(self._vocab)),
            eos_text=self._piece_text(llama_cpp.llama_vocab_eos(self._vocab)),
        )

    @property
    def vocab_size(self) -> int:
        return self.n_vocab

    @property
    def control_ids(self) -> frozenset[int]:
        """Ids that only the chat template's markers (and BOS/EOS added on request) produce."""
        return frozenset(token for token, _, _ in self._markers.values())

    def _control_markers(self) -> dict[str, tuple[int, bool, bool]]:
        """Text of every token llama.cpp reads as a marker under ``parse_special``, with its id
        and whether it eats the whitespace before (lstrip) and after (rstrip) it."""
        markers: dict[str, tuple[int, bool, bool]] = {}
        wanted = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
        for token in range(self.n_vocab):
            attr = int(llama_cpp.llama_vocab_get_attr(self._vocab, token))
            text = llama_cpp.llama_vocab_get_text(self._vocab, token).decode("utf-8", errors="replace")
            if attr & wanted and text:
                lstrip = bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP)
                markers.setdefault(text, (token, lstrip, bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP)))
        return markers

    def _piece_text(self, token: int) -> str:
        return self.token_bytes(token).decode("utf-8", errors="replace") if token >= 0 else ""

    def encode(self, text: str, *, add_special: bool) -> list[int]:
        """Tokens of ``text`` as text (markers in it stay characters); BOS/EOS if ``add_special``."""
        raw = text.encode("utf-8")
        capacity = len(raw) + 16
        while True:
            buffer = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(self._vocab, raw, len(raw), buffer, capacity, add_special, False)
            if count >= 0:
                return list(buffer[:count])
            capacity = -count

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Tokens of the chat as the template renders it, markers only where the template wrote them.

        ``tools`` and the messages' ``tool_calls`` are written by the template as its own text, so a
        control marker inside them is refused rather than read as a marker."""
        self._refuse_markers_in_tools(messages, tools)
        pieces = self._template.pieces(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        if pieces is None:
            # A template that rewrites content: unsplittable, so safe only if no content has a marker.
            marked = next((m["content"] for m in messages if self._marker_pattern.search(m["content"])), None)
            if self._markers and marked is not None:
                found = self._marker_pattern.search(marked)
                raise InvalidArgument(
                    f"a message contains the control marker {found.group(0) if found else ''!r}, which this "
                    "model's chat template cannot keep as text; remove it from the message"
                )
            text = self._template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
            pieces = [ChatPiece(text, False)]
        return self._tokenize_pieces(pieces)

    def encode_chat_continuation(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """Tokens of a chat whose final assistant message the model continues (assistant
        prefill, ``chat_prefill``): the prompt ends inside that message, with no end of turn."""
        self._refuse_markers_in_tools(messages, tools)
        return self._tokenize_pieces(continuation_pieces(self._template, messages, tools=tools))

    def _refuse_markers_in_tools(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> None:
        structured = [tools or [], *(m.get("tool_calls") or [] for m in messages)]
        found = self._markers and self._marker_pattern.search(json.dumps(structured, ensure_ascii=False))
        if found:
            raise InvalidArgument(
                f"tools or tool calls contain the control marker {found.group(0)!r}, which this model's chat "
                "template would read as a marker; remove it"
            )

    def _tokenize_pieces(self, pieces: Sequence[ChatPiece]) -> list[int]:
        tokens: list[int] = []
        run = ""
        strip_next = False
        for piece in pieces:
            cursor = 0
            found_all = [] if piece.content or not self._markers else list(self._marker_pattern.finditer(piece.text))
            for found in found_all:
                token, lstrip, rstrip = self._markers[found.group(0)]
                run += piece.text[cursor : found.start()]
                tokens += self._stretch(run.rstrip() if lstrip else run, strip_next)
                tokens.append(token)
                run, strip_next, cursor = "", rstrip, found.end()
            run += piece.text[cursor:]
        return tokens + self._stretch(run, strip_next)

    def _stretch(self, text: str, strip_leading: bool) -> list[int]:
        """One stretch between markers, tokenized on its own as llama.cpp's partition does."""
        text = text.lstrip() if strip_leading else text
        return self.encode(text, add_special=False) if text else []

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

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        """The chat as text, for display; tokenize it with ``encode_chat``, never ``encode``."""
        return self._template.render(messages, add_generation_prompt=add_generation_prompt)

    def close(self) -> None:
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None
