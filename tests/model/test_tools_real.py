"""Tools with SmolLM2-135M-Instruct (real weights) on a 2-way split, with the official client.

SmolLM2's template knows nothing of tools, so the generic format applies: the tools listed in a
system preamble, calls in ``<tool_call>`` tags. With ``tool_choice`` required the split's call
must be exactly the whole model's (the in-process llama.cpp model, greedy under the same call
grammar, written token for token), its arguments must validate against the schema, and the client's round trip (the
``tool`` result sent back) must end in an answer. Needs MESHNET_ENABLE_REAL_INFERENCE_TESTS=1.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from smollm2_model import ENABLED_MARK, MODEL, PROVISIONED_MARK
from swarm_harness import MODEL_NAME, Reference, Swarm

from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.sampling_options import LogitAdjustments, OutputConstraint
from meshnet.engine.constraints import GrammarVocabulary, json_schema_constraint
from meshnet.engine.local_route import LocalRoute
from meshnet.gateway.schemas import ChatCompletionBody
from meshnet.gateway.tools.grammar import call_schema, lazy_triggers, wrap_call_grammar
from meshnet.gateway.tools.parse import parse_reply
from meshnet.gateway.tools.plan import read_tool_plan
from meshnet.gateway.tools.render import template_messages, template_tools

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(300), ENABLED_MARK, PROVISIONED_MARK]

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": PARAMETERS},
    }
]
QUESTION: list[Any] = [{"role": "user", "content": "What is the weather like in Paris today?"}]
REQUEST: dict[str, Any] = {"model": MODEL_NAME, "tools": TOOLS, "temperature": 0, "max_tokens": 64}
ONE_CALL: dict[str, Any] = {"tool_choice": "required", "parallel_tool_calls": False}
BIAS = 5.0
"""On each token of ``<tool_call>``: SmolLM2 then opens a call (greedy), but cannot finish one alone."""


def _whole_reply(
    tmp_path: Path, fields: dict[str, Any], bias: float = 0.0, *, grammar_on: bool = True
) -> tuple[str, Any]:
    """The whole model's greedy reply (text and tool plan) under the grammar the gateway builds
    for ``fields`` (the call grammar, lazy for ``auto``), from the same prompt, with ``bias``
    added to each token of the call's opening tag (``grammar_on`` False: no grammar at all)."""
    body = ChatCompletionBody.model_validate({**REQUEST, "messages": QUESTION, **fields})
    reference = Reference(MODEL, tmp_path / "reference-cache", context=2048)
    vocabulary = GrammarVocabulary(MODEL)
    try:
        plan = read_tool_plan(body, reference.tokenizer.chat_template_source)
        if plan is None:
            raise AssertionError("tools give a plan")
        plain = [{"role": "user", "content": QUESTION[0]["content"]}]
        messages = template_messages(body.messages, plain, plan)
        prompt = reference.tokenizer.encode_chat(messages, tools=template_tools(plan))
        grammar = wrap_call_grammar(json_schema_constraint(call_schema(plan)).grammar, plan.format, several=False)
        triggers = () if plan.constrained else lazy_triggers(plan.format)
        # The whole model with the model's vocabulary for the grammar, as a tail holds it.
        whole = LocalRoute(reference.route.backends, vocabulary)
        adjustments = LogitAdjustments(
            logit_bias=tuple((token, bias) for token in _tag_tokens(reference)) if bias else ()
        )
        constraint = OutputConstraint(grammar, triggers=triggers) if grammar_on else None
        sampling = SamplingParams(constraint=constraint, adjustments=adjustments)
        request = GenerationRequest(tuple(prompt), 64, sampling, reference.tokenizer.eos_token_ids)
        return reference.text([token for token, _ in whole.choices(request)]), plan
    finally:
        reference.close()
        vocabulary.close()


def _tag_tokens(reference: Reference) -> list[int]:
    return sorted(set(reference.tokenizer.encode("<tool_call>", add_special=False)))


def _reference_call(tmp_path: Path) -> tuple[str, tuple[str, dict[str, Any]]]:
    """The whole model's greedy reply text and call under the call grammar, from the same prompt."""
    text, plan = _whole_reply(tmp_path, ONE_CALL)
    (call,) = parse_reply(text, plan).calls
    return text, (call.name, json.loads(call.arguments))


def _written(choice: Any) -> str:
    """The text the served model wrote, call tags and JSON included, from its per-token logprobs.

    A parsed call hides how the JSON was written (property order, spacing): a grammar that
    differs from the oracle's (say, properties in another order) can still parse to the same
    call, and then shows only where the model's choices meet a near tie."""
    return "".join(item.token for item in choice.logprobs.content)


@contextmanager
def _split_client(tmp_path: Path) -> Iterator[openai.OpenAI]:
    """The official client on SmolLM2 split in two (tracker, two workers, gateway: processes)."""
    with Swarm(tmp_path / "swarm", MODEL) as swarm:
        swarm.start_tracker()
        swarm.start_workers("0:15", "15:30", n_ctx_per_session=2048)
        base_url = swarm.start_gateway()
        swarm.wait_routable(nodes=2)
        with openai.OpenAI(base_url=f"{base_url}/v1", api_key=swarm.api_key, max_retries=0, timeout=120) as client:
            yield client


def test_smollm2_calls_as_the_whole_model_and_finishes_the_round_trip(tmp_path: Path) -> None:
    written, expected = _reference_call(tmp_path)
    with _split_client(tmp_path) as client:
        reply = client.chat.completions.create(
            **REQUEST, messages=QUESTION, tool_choice="required", parallel_tool_calls=False, logprobs=True
        )
        choice = reply.choices[0]
        assert _written(choice) == written
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls or []
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, PARAMETERS)
        assert (call.function.name, arguments) == expected
        history = [
            *QUESTION,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'},
        ]
        final = client.chat.completions.create(**REQUEST, messages=history)
    answer = final.choices[0]
    assert answer.finish_reason in ("stop", "length", "tool_calls")
    assert answer.message.content or answer.message.tool_calls


def test_auto_lazy_grammar_engages_through_the_split_as_in_the_whole_model(tmp_path: Path) -> None:
    # tool_choice auto (the default): a logit bias on the opening tag's tokens makes SmolLM2 open
    # a call; from the tag on the lazy grammar holds (the same bias with no grammar writes no
    # call at all), so the call parses and validates, and is never content. Without the bias the
    # reply stays free text. Each reply is the whole model's under the same lazy grammar.
    single = {"parallel_tool_calls": False}
    biased_text, plan = _whole_reply(tmp_path, single, bias=BIAS)
    free_text, _ = _whole_reply(tmp_path, single)
    (expected,) = parse_reply(biased_text, plan).calls
    assert not parse_reply(free_text, plan).calls
    assert not parse_reply(_whole_reply(tmp_path, single, bias=BIAS, grammar_on=False)[0], plan).calls
    reference = Reference(MODEL, tmp_path / "reference-cache", context=2048)
    try:
        bias = {str(token): BIAS for token in _tag_tokens(reference)}
    finally:
        reference.close()
    with _split_client(tmp_path) as client:
        called = client.chat.completions.create(
            **REQUEST, messages=QUESTION, logit_bias=bias, logprobs=True, **single
        ).choices[0]
        free = client.chat.completions.create(**REQUEST, messages=QUESTION, **single).choices[0]
    assert called.finish_reason == "tool_calls" and called.message.content is None
    assert _written(called) == biased_text
    (call,) = called.message.tool_calls or []
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS)
    assert (call.function.name, call.function.arguments) == (expected.name, expected.arguments)
    assert free.message.tool_calls is None and free.message.content == free_text
