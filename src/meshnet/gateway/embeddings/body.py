"""The embeddings request body and the pure decisions on it: inputs to token ids, vectors to JSON.

OpenAI's ``input`` is one string, a list of strings, one list of token ids, or a list of such
lists; each becomes one embedding, in order. A string is tokenized as ``llama.cpp``'s
``Llama.embed`` tokenizes it (with the model's BOS), so the vector equals whole-model
llama.cpp's. ``encoding_format`` ``base64`` is the vector's little-endian float32 bytes, as
OpenAI sends it (its Python client asks for it by default); ``float`` is the float64 values as
llama-cpp-python returns them. Embeddings are never truncated: ``dimensions`` is served only
when it equals the model's width.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from meshnet.gateway.errors import bad_request
from meshnet.gateway.ports import TextCodec
from meshnet.gateway.prepare import checked_ids

MAX_INPUTS = 2048
"""OpenAI's limit on the inputs of one request."""

EmbeddingInput = str | list[str] | list[int] | list[list[int]]


class EmbeddingsBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    model: str
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None


def input_tokens(body: EmbeddingsBody, codec: TextCodec, context_length: int) -> tuple[tuple[int, ...], ...]:
    """Each input of ``body`` as the token ids its embedding is computed from (400s on bad input)."""
    items = _items(body.input)
    if not items:
        raise bad_request("empty_input", "the input is empty: give a string, token ids, or a list of them", "input")
    if len(items) > MAX_INPUTS:
        raise bad_request("invalid_parameter", f"at most {MAX_INPUTS} inputs per request, got {len(items)}", "input")
    return tuple(_tokens(index, item, codec, context_length) for index, item in enumerate(items))


def _items(raw: EmbeddingInput) -> list[str | list[int]]:
    """The inputs one by one: a string, or one list of token ids, is a single input."""
    if isinstance(raw, str):
        return [raw]
    ids = [item for item in raw if isinstance(item, int)]
    if raw and len(ids) == len(raw):
        return [ids]
    return [item for item in raw if not isinstance(item, int)]


def _tokens(index: int, item: str | list[int], codec: TextCodec, context_length: int) -> tuple[int, ...]:
    param = f"input[{index}]"
    if isinstance(item, str) and not item:
        raise bad_request("empty_input", f"{param} is an empty string", "input")
    tokens = codec.encode(item, add_special=True) if isinstance(item, str) else item
    if not tokens:
        raise bad_request("empty_input", f"{param} is empty: it encodes to no tokens", "input")
    checked_ids(tokens, codec.vocab_size, "input", param)
    if len(tokens) > context_length:
        raise bad_request(
            "context_length_exceeded",
            f"{param} is {len(tokens)} tokens; this model's sessions hold at most {context_length}",
            "input",
        )
    return tuple(tokens)


def check_dimensions(body: EmbeddingsBody, width: int) -> None:
    """Refuse ``dimensions`` unless it is the model's own width (embeddings are not truncated)."""
    if body.dimensions is not None and body.dimensions != width:
        raise bad_request(
            "unsupported_parameter",
            f"dimensions {body.dimensions} is not served: this model's embeddings have {width} values "
            f"and are not truncated (omit dimensions, or give it as {width})",
            "dimensions",
        )


def encoded(vector: tuple[float, ...], encoding_format: Literal["float", "base64"]) -> list[float] | str:
    """The vector as OpenAI sends it: the values, or base64 of their little-endian float32 bytes."""
    if encoding_format == "float":
        return list(vector)
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def embeddings_object(
    model: str, vectors: Sequence[tuple[float, ...]], encoding_format: Literal["float", "base64"], prompt_tokens: int
) -> dict[str, Any]:
    """The ``list`` object ``client.embeddings.create`` reads."""
    data = [
        {"object": "embedding", "index": index, "embedding": encoded(vector, encoding_format)}
        for index, vector in enumerate(vectors)
    ]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}
