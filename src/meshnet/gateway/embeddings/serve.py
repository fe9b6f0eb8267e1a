"""Serving one embeddings request: admission as any request, one route prefill per input.

The request takes one admission slot (queued as the completions are) and its inputs run one
after another on it, each on a route of its own (``route.embedding``) under its own request id
(``<id>-i`` for input i > 0, as the choices of ``n``), so each has its own work record. Its
telemetry log opens when it is admitted and ends ``completed`` with its usage (after an
``accepted`` naming the route of the last input, which the request log line shows), or
``failed`` with whatever ended it: a typed error, the client gone, anything unexpected. A swarm
whose generator cannot embed answers 501 naming why, and a ``dimensions`` other than the
model's width a 400, before anything is admitted.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

from meshnet.core.embedding import Embedded, EmbeddingSpec
from meshnet.core.errors import InvalidArgument, MeshnetError
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import RequestId
from meshnet.gateway.choice_view import accepted_payload
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
    check_dimensions(body, codec.embedding_width)
    request_id: RequestId = request.state.request_id
    lease, _ = await service.admit(request, request_id, body.model)
    try:
        # Each input is a route session of its own, billed under its own id as a choice is.
        embedded = [
            await _embed(embedder, service, body, tokens, choice_request_id(request_id, index))
            for index, tokens in enumerate(inputs)
        ]
        # The route is known once an input is embedded; the log line names the last input's.
        service.hub.publish(request_id, "accepted", accepted_payload(embedded[-1].route, lease.waited_s))
    except BaseException as error:  # cancelled or failed: the log ends either way, then re-raise
        service.hub.publish(request_id, "failed", _failure(error, request_id))
        raise
    finally:
        lease.release()
    prompt_tokens = sum(len(tokens) for tokens in inputs)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}
    service.hub.publish(request_id, "completed", {"usage": usage, "finish_reason": "stop"})
    vectors = [item.vector for item in embedded]
    return embeddings_object(body.model, vectors, body.encoding_format, prompt_tokens)


def _failure(error: BaseException, request_id: RequestId) -> dict[str, Any]:
    """The ``failed`` event's error: a typed error's own code, ``cancelled`` or ``internal`` otherwise."""
    if isinstance(error, MeshnetError | HttpError):
        retryable = isinstance(error, MeshnetError) and error.retryable
        return {"code": error.code, "message": error.message, "retryable": retryable, "request_id": request_id}
    code = "cancelled" if isinstance(error, asyncio.CancelledError) else "internal"
    return {"code": code, "message": f"embedding ended: {error!r}"[:200], "retryable": False, "request_id": request_id}


async def _embed(
    embedder: Embedder, service: CompletionService, body: EmbeddingsBody, tokens: tuple[int, ...], request_id: RequestId
) -> Embedded:
    try:
        generation = GenerationRequest(tokens, 1, model=body.model, timeout_s=service.config.request_timeout_seconds)
    except InvalidArgument as error:
        raise bad_request(error.code, error.message, "input") from None
    return await embedder.embed(generation, EmbeddingSpec(), request_id)
