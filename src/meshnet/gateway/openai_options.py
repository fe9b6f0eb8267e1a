"""The OpenAI parameters the tail honours beyond temperature / top-k / top-p, checked and translated.

``logprobs`` / ``top_logprobs``, ``logit_bias``, ``presence_penalty`` / ``frequency_penalty``,
``repetition_penalty``,
``response_format`` and ``n``: each becomes a typed core value (``core.sampling_options``), or a
400 naming the parameter when the value cannot be honoured as asked.
"""

from __future__ import annotations

from meshnet.core.errors import InvalidArgument
from meshnet.core.sampling_options import LogitAdjustments, LogprobRequest, OutputConstraint
from meshnet.engine.constraints import json_object_constraint
from meshnet.gateway.config import GatewayConfig
from meshnet.gateway.errors import bad_request
from meshnet.gateway.grammars import GrammarBuilder
from meshnet.gateway.schemas import ChatCompletionBody, CompletionBody

Body = ChatCompletionBody | CompletionBody


def choice_count(body: Body, config: GatewayConfig) -> int:
    n = 1 if body.n is None else body.n
    if n > config.max_choices:
        raise bad_request(
            "invalid_parameter", f"n is {n}; this gateway generates at most {config.max_choices} choices", "n"
        )
    return n


def logprob_request(body: Body) -> LogprobRequest | None:
    if isinstance(body, CompletionBody):
        return None if body.logprobs is None else LogprobRequest(body.logprobs)
    if body.top_logprobs and not body.logprobs:
        raise bad_request("invalid_parameter", "top_logprobs needs logprobs: true", "top_logprobs")
    return LogprobRequest(body.top_logprobs or 0) if body.logprobs else None


def logit_adjustments(body: Body, vocab_size: int) -> LogitAdjustments:
    entries: dict[int, float] = {}
    for key, bias in (body.logit_bias or {}).items():
        if not key.isascii() or not key.isdigit() or not 0 <= int(key) < vocab_size:
            raise bad_request(
                "invalid_parameter",
                f"logit_bias key {key[:20]!r} is not a token id of this model (0 to {vocab_size - 1})",
                "logit_bias",
            )
        entries[int(key)] = bias
    try:
        return LogitAdjustments(
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            logit_bias=tuple(sorted(entries.items())),
            repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        )
    except InvalidArgument as err:
        raise bad_request(err.code, err.message, "logit_bias") from None


def output_constraint(body: Body, schema_constraint: OutputConstraint | None) -> OutputConstraint | None:
    """The grammar ``response_format`` asks for; ``schema_constraint`` is the one
    ``build_schema_constraint`` built for a ``json_schema``."""
    response_format = body.response_format
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return json_object_constraint()
    if schema_constraint is None:
        raise bad_request(
            "invalid_parameter", "response_format json_schema needs a json_schema object", "response_format"
        )
    return schema_constraint


async def build_schema_constraint(body: Body, grammars: GrammarBuilder) -> OutputConstraint | None:
    """The grammar of a ``json_schema`` response format, built off the event loop; None otherwise."""
    response_format = body.response_format
    if response_format is None or response_format.type != "json_schema" or response_format.json_schema is None:
        return None
    try:
        return await grammars.json_schema(response_format.json_schema.schema_)
    except InvalidArgument as err:
        raise bad_request(err.code, err.message, "response_format") from None
