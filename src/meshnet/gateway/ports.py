"""What the gateway needs from the rest of meshnet, as structural ``Protocol``s.

The gateway receives a route generator and one text codec per model by dependency injection;
it never constructs either, so tests drive it with scripted doubles and the lead wires the real
client and tokenizer in ``cli``. Nothing here imports FastAPI: these are plain domain ports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from meshnet.core.embedding import Embedded, EmbeddingSpec
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import RequestId
from meshnet.core.swarm_status import NodeTable
from meshnet.route.life import LifeSink, TextPlug


@dataclass(frozen=True)
class ModelCard:
    """One servable model as ``GET /v1/models`` lists it."""

    id: str
    """The name clients put in the ``model`` field."""
    quantization: str
    """Weight quantization of the GGUF the route serves (e.g. ``Q8_0``)."""
    context_length: int
    """Largest prompt + completion length, in tokens, the route accepts."""
    owned_by: str = "meshnet"
    adapter: str = ""
    """The architecture adapter and its version the shards slice the model with (``gemma3:1``)."""


class IncrementalDecoder(Protocol):
    """Turns a stream of token ids into text without splitting multi-byte characters."""

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completed (may be empty mid-character)."""
        ...

    def flush(self) -> str:
        """Return whatever text is still held back once generation ends."""
        ...


class TextCodec(Protocol):
    """Tokenizer and chat template of one model."""

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    @property
    def context_length(self) -> int: ...

    @property
    def vocab_size(self) -> int:
        """Token ids are ``0 .. vocab_size - 1``: anything else in a prompt is refused up front."""
        ...

    @property
    def embedding_width(self) -> int:
        """Values in one of the model's embeddings (its hidden width, ``n_embd``)."""
        ...

    def encode(self, text: str, *, add_special: bool) -> list[int]:
        """Tokens of plain text: control-token markers in ``text`` stay text."""
        ...

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Tokens of a chat rendered by the model's template: only the template's own markers
        become control tokens, never text inside a message (no role injection). ``tools`` and
        messages' ``tool_calls`` are passed to the template (gateway/tools/render.py)."""
        ...

    @property
    def chat_template_source(self) -> str | None:
        """The Jinja chat template in use (it decides the tool format); None for a base model."""
        ...

    def encode_chat_continuation(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """Tokens of a chat whose final assistant message the model continues (assistant
        prefill): the prompt ends inside that message, with no end of turn and no new turn."""
        ...

    def new_decoder(self) -> IncrementalDecoder: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (what ``logprobs`` reports per token)."""
        ...


class RouteGenerator(Protocol):
    """Serves one request along a route of shards, pushing what happens into the caller's sink.

    ``serve`` pushes (``route.life``) ``RouteAccepted``, prefill/decode notes, one ``TokenText``
    per token (its text from the caller's ``text`` plug, which also finds stop strings),
    ``RouteHealth`` notes and, once the route is released, the ``Outcome`` or the ``Failure``;
    it never raises a failure. How the request ends is decided and recorded on the route side,
    never by the gateway. Cancelling the task that runs ``serve`` (the HTTP client went away)
    cancels the route session; the implementation must free it before it returns.
    """

    async def serve(
        self, request: GenerationRequest, request_id: RequestId, text: TextPlug, sink: LifeSink
    ) -> None: ...

    def models(self) -> Sequence[ModelCard]: ...

    async def session_slots(self) -> int | None:
        """Sessions the swarm admits at once (its head shards' ``max_sessions``); None if unknown."""
        ...


@runtime_checkable
class Embedder(Protocol):
    """A route generator that also embeds (``POST /v1/embeddings``); one that is not is refused."""

    async def embed(self, request: GenerationRequest, spec: EmbeddingSpec, request_id: RequestId) -> Embedded:
        """The pooled embedding of ``request.prompt_tokens`` (float64) and the route that computed it."""
        ...


class SwarmView(Protocol):
    """What the status page, ``/health`` and ``/v1/models`` read of the swarm."""

    async def node_table(self) -> NodeTable:
        """The tracker's live node table; raises a ``MeshnetError`` when it cannot be asked."""
        ...

    async def route_context(self, model: str) -> int | None:
        """Tokens one session holds on the route the tracker would give ``model`` now (the
        smallest ``n_ctx_per_session`` of its hops); None when no route exists."""
        ...
