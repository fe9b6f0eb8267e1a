"""Pure translation of a validated request body into what the route serves.

Checks everything that depends on the model or the configuration (known model, context cap,
``max_tokens`` limit, stop sequences, unsupported values), tokenizes the prompt and builds the
core ``GenerationRequest``. Raises ``HttpError`` (4xx) for anything the client must change.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from meshnet.core.errors import InvalidArgument
from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.sampling_options import OutputConstraint
from meshnet.gateway.config import GatewayConfig
from meshnet.gateway.errors import HttpError, bad_request
from meshnet.gateway.openai_options import choice_count, logit_adjustments, logprob_request, output_constraint
from meshnet.gateway.ports import ModelCard, TextCodec
from meshnet.gateway.schemas import (
    ChatCompletionBody,
    ChatMessage,
    CompletionBody,
    unsupported_parameters,
)
from meshnet.gateway.tools.plan import ToolPlan
from meshnet.gateway.tools.render import template_messages, template_tools

EndpointKind = Literal["chat", "text"]
TOKEN_ID_LIMIT = 2**31
"""Token ids given directly in a prompt must fit the int32 the engine and wire use."""


@dataclass(frozen=True)
class PreparedRequest:
    """A request the route can serve: tokens, budget, sampling, stop strings, stream shape."""

    kind: EndpointKind
    model: str
    generation: GenerationRequest
    stop_sequences: tuple[str, ...]
    stream: bool
    include_usage: bool
    choices: int = 1
    """``n``: independent choices; choice i samples with seed + i (see ``choice_generation``)."""
    tools: ToolPlan | None = None
    """The request's tools (chat only): the reply is parsed for calls when ``tools.active``."""

    @property
    def logprobs(self) -> bool:
        return self.generation.sampling.logprobs is not None

    def choice_generation(self, index: int) -> GenerationRequest:
        """The request of choice ``index``: its own seed, so sampled choices differ."""
        if index == 0:
            return self.generation
        sampling = self.generation.sampling
        return replace(self.generation, sampling=replace(sampling, seed=(sampling.seed + index) % 2**63))


@dataclass(frozen=True)
class ModelLimits:
    """What bounds a request for one model: the smaller of the codec's and the route's caps."""

    context_length: int


def model_limits(model: str, codec: TextCodec, cards: Sequence[ModelCard]) -> ModelLimits:
    card_caps = [card.context_length for card in cards if card.id == model]
    return ModelLimits(context_length=min([codec.context_length, *card_caps]))


def prepare_chat(
    body: ChatCompletionBody,
    codec: TextCodec,
    limits: ModelLimits,
    config: GatewayConfig,
    schema_constraint: OutputConstraint | None = None,
    tools: ToolPlan | None = None,
) -> PreparedRequest:
    """The chat request the route serves; ``schema_constraint``: the built ``json_schema`` grammar,
    or with a required / named ``tools`` choice the built tool-call grammar (gateway/tools)."""
    _reject_unsupported(body)
    plain = [_plain_message(index, message, tools) for index, message in enumerate(body.messages)]
    messages = template_messages(body.messages, plain, tools)
    # Only the template's own markers become control tokens: text a user sends stays text.
    # A trailing assistant message is continued (assistant prefill), not followed by a new turn.
    try:
        if body.messages[-1].role == "assistant":
            tokens = codec.encode_chat_continuation(messages, tools=template_tools(tools))
        else:
            tokens = codec.encode_chat(messages, add_generation_prompt=True, tools=template_tools(tools))
    except InvalidArgument as err:  # the template refused these messages
        raise bad_request(err.code, err.message, "messages") from None
    requested = body.max_completion_tokens or body.max_tokens
    by_tools = tools is not None and tools.grammar
    constraint = schema_constraint if by_tools else output_constraint(body, schema_constraint)
    prepared = _prepare(body, "chat", tokens, requested, codec, limits, config, constraint)
    return replace(prepared, tools=tools)


def prepare_text(
    body: CompletionBody,
    codec: TextCodec,
    limits: ModelLimits,
    config: GatewayConfig,
    schema_constraint: OutputConstraint | None = None,
) -> PreparedRequest:
    _reject_unsupported(body)
    tokens = _prompt_tokens(body, codec)
    constraint = output_constraint(body, schema_constraint)
    return _prepare(body, "text", tokens, body.max_tokens, codec, limits, config, constraint)


def _prepare(
    body: ChatCompletionBody | CompletionBody,
    kind: EndpointKind,
    tokens: Sequence[int],
    requested_max: int | None,
    codec: TextCodec,
    limits: ModelLimits,
    config: GatewayConfig,
    constraint: OutputConstraint | None,
) -> PreparedRequest:
    if not tokens:
        raise bad_request("empty_prompt", "the prompt encodes to no tokens", "prompt")
    max_tokens = _completion_budget(len(tokens), requested_max, limits, config)
    try:
        generation = GenerationRequest(
            prompt_tokens=tuple(tokens),
            max_tokens=max_tokens,
            sampling=_sampling(body, codec.vocab_size, constraint),
            stop_tokens=codec.eos_token_ids,
            model=body.model,
            timeout_s=config.request_timeout_seconds,
            cache_salt=body.cache_salt or "",
        )
    except InvalidArgument as err:  # the core re-checks ranges; report its words as a 400
        raise bad_request(err.code, err.message) from None
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return PreparedRequest(
        kind=kind,
        model=body.model,
        generation=generation,
        stop_sequences=_stop_sequences(body.stop, config),
        stream=body.stream,
        include_usage=include_usage,
        choices=choice_count(body, config),
    )


def _completion_budget(prompt_tokens: int, requested: int | None, limits: ModelLimits, config: GatewayConfig) -> int:
    context = limits.context_length
    if prompt_tokens >= context:
        raise bad_request(
            "context_length_exceeded",
            f"the prompt is {prompt_tokens} tokens; this model's context holds {context}, "
            "leaving no room to generate. Shorten the prompt.",
            "messages",
        )
    room = context - prompt_tokens
    if requested is None:
        return min(config.default_max_tokens, room)
    if requested > config.max_tokens_limit:
        raise bad_request(
            "invalid_parameter",
            f"max_tokens is {requested}; this gateway allows at most {config.max_tokens_limit}",
            "max_tokens",
        )
    if requested > room:
        raise bad_request(
            "context_length_exceeded",
            f"prompt ({prompt_tokens} tokens) + max_tokens ({requested}) exceeds this model's "
            f"context of {context} tokens; lower max_tokens to at most {room}",
            "max_tokens",
        )
    return requested


def _sampling(
    body: ChatCompletionBody | CompletionBody, vocab_size: int, constraint: OutputConstraint | None
) -> SamplingParams:
    temperature = 1.0 if body.temperature is None else body.temperature
    # Without a seed a sampled answer should differ between calls, as OpenAI's does; the seed is
    # drawn per request, never from shared state.
    drawn = 0 if temperature == 0.0 else secrets.randbits(63)
    seed = drawn if body.seed is None else body.seed % 2**63
    return SamplingParams(
        temperature=temperature,
        top_k=body.top_k or 0,
        top_p=1.0 if body.top_p is None else body.top_p,
        min_p=body.min_p or 0.0,
        seed=seed,
        adjustments=logit_adjustments(body, vocab_size),
        logprobs=logprob_request(body),
        constraint=constraint,
    )


def _stop_sequences(stop: str | list[str] | None, config: GatewayConfig) -> tuple[str, ...]:
    if stop is None:
        return ()
    sequences = [stop] if isinstance(stop, str) else list(stop)
    if len(sequences) > config.max_stop_sequences:
        raise bad_request(
            "invalid_parameter",
            f"stop gives {len(sequences)} sequences; at most {config.max_stop_sequences} allowed",
            "stop",
        )
    if any(not sequence for sequence in sequences):
        raise bad_request("invalid_parameter", "stop sequences must not be empty", "stop")
    return tuple(dict.fromkeys(sequences))


def _reject_unsupported(body: ChatCompletionBody | CompletionBody) -> None:
    names = unsupported_parameters(body)
    if names:
        raise bad_request(
            "unsupported_parameter",
            f"{names[0]} is not supported by this server with the value given "
            "(no legacy functions, echo, suffix or best_of)",
            names[0],
        )


def _plain_message(index: int, message: ChatMessage, tools: ToolPlan | None) -> Mapping[str, str]:
    param = f"messages.{index}"
    if message.role == "function" or (message.role == "tool" and tools is None):
        raise bad_request(
            "unsupported_parameter",
            f"role {message.role!r} is unsupported here (use tools and tool messages)",
            f"{param}.role",
        )
    # Chat templates of open models know "system"; OpenAI's newer "developer" means the same.
    role = "system" if message.role == "developer" else message.role
    content = message.content
    if content is None:
        if message.role != "assistant":
            raise bad_request("invalid_parameter", "content is required", f"{param}.content")
        return {"role": role, "content": ""}
    if isinstance(content, str):
        return {"role": role, "content": content}
    return {"role": role, "content": joined_text(content, ("text",), f"{param}.content")}


class TextPart(Protocol):
    """A content part: chat's ``text``, Responses' ``input_text`` / ``output_text``."""

    @property
    def type(self) -> str: ...

    @property
    def text(self) -> str | None: ...


def joined_text(parts: Sequence[TextPart], kinds: tuple[str, ...], param: str) -> str:
    """The text of content ``parts`` joined, or a 400 naming a part that is not of ``kinds``."""
    texts: list[str] = []
    for part in parts:
        if part.type not in kinds or part.text is None:
            raise bad_request(
                "unsupported_parameter",
                f"content part of type {part.type!r} is unsupported; only {' and '.join(kinds)} parts are",
                param,
            )
        texts.append(part.text)
    return "".join(texts)


def _prompt_tokens(body: CompletionBody, codec: TextCodec) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return codec.encode(prompt, add_special=True)
    if not prompt:
        raise bad_request("empty_prompt", "the prompt is empty", "prompt")
    if all(isinstance(item, int) for item in prompt):
        return checked_ids([item for item in prompt if isinstance(item, int)], codec.vocab_size)
    if len(prompt) != 1:
        raise bad_request("unsupported_parameter", "batched prompts are unsupported: send one prompt", "prompt")
    only = prompt[0]
    if isinstance(only, str):
        return codec.encode(only, add_special=True)
    if isinstance(only, list):
        return checked_ids(only, codec.vocab_size)
    raise bad_request("invalid_parameter", "prompt has an unexpected shape", "prompt")


def checked_ids(ids: list[int], vocab_size: int, param: str = "prompt", label: str = "prompt") -> list[int]:
    """``ids``, or a 400 on ``param`` naming the first outside the vocabulary (as ``label``)."""
    # Checked here, not by the head shard: a stream must not answer 200 and then fail on input.
    limit = min(vocab_size, TOKEN_ID_LIMIT)
    bad = next((token for token in ids if not 0 <= token < limit), None)
    if bad is not None:
        raise bad_request(
            "invalid_parameter", f"{label} token id {bad} is outside this model's vocabulary [0, {limit})", param
        )
    return ids


def unknown_model(model: str, known: Sequence[str]) -> HttpError:
    listing = ", ".join(sorted(known)) or "none"
    return HttpError(
        404,
        "model_not_found",
        f"the model {model!r} does not exist on this gateway; available: {listing}",
        param="model",
    )
