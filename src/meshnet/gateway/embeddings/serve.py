"""Serving one embeddings request: admission as any request, one route prefill per input.

The request takes one admission slot (queued as the completions are) and its inputs run one
after another on it, each on a route of its own (``route.embedding``) under its own request id
(``<id>-i`` for input i > 0, as the choices of ``n``), so each has its own work record. Its
telemetry log opens when it is admitted and ends ``completed`` with its usage, or ``failed``
with the error. A swarm whose generator cannot embed answers 501 naming why, before anything
is admitted.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from meshnet.core.embedding import EmbeddingSpec
from meshnet.core.errors import InvalidArgument, MeshnetError
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import RequestId
from meshnet.gateway.choices import choice_request_id
from meshnet.gateway.embeddings.body import EmbeddingsBody, check_dimensions, embeddings_object, input_tokens
from meshnet.gateway.errors import HttpError, bad_request
from meshnet.gateway.ports import Embedder, TextCodec
from meshnet.gateway.service import CompletionService


async def serve_embeddings(
    service: CompletionService, request: Request, body: EmbeddingsBody, codec: TextCodec, context_length: int
) -> dict[str, Any]:
    """The embeddings object for ``body`` (every input embedded, in order)."""
    embedder = service.generator
    if not isinstance(embedder, Embedder):
        raise HttpError(501, "embeddings_unsupported", "this gateway's swarm cannot serve embeddings", param="model")
    inputs = input_tokens(body, codec, context_length)
    request_id: RequestId = request.state.request_id
    lease, _ = await service.admit(request, request_id, body.model)
    try:
        # Each input is a route session of its own, billed under its own id as a choice is.
        vectors = [
            await _embed(embedder, service, body, tokens, choice_request_id(request_id, index))
            for index, tokens in enumerate(inputs)
        ]
    except (MeshnetError, HttpError) as error:
        retryable = isinstance(error, MeshnetError) and error.retryable
        failed = {"code": error.code, "message": error.message, "retryable": retryable, "request_id": request_id}
        service.hub.publish(request_id, "failed", failed)
        raise
    finally:
        lease.release()
    prompt_tokens = sum(len(tokens) for tokens in inputs)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}
    service.hub.publish(request_id, "completed", {"usage": usage, "finish_reason": "stop"})
    return embeddings_object(body.model, vectors, body.encoding_format, prompt_tokens)


async def _embed(
    embedder: Embedder, service: CompletionService, body: EmbeddingsBody, tokens: tuple[int, ...], request_id: RequestId
) -> tuple[float, ...]:
    try:
        generation = GenerationRequest(tokens, 1, model=body.model, timeout_s=service.config.request_timeout_seconds)
    except InvalidArgument as error:
        raise bad_request(error.code, error.message, "input") from None
    vector = await embedder.embed(generation, EmbeddingSpec(), request_id)
    check_dimensions(body, len(vector))
    return vector
