"""Tools / function calling, the pure parts: format choice, parsing (whole and token by token),
request checks, rendering through the families' templates, and the call grammar (run by
llama.cpp's own grammar sampler over a synthetic model's vocabulary)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import TINY_CHAT_TEMPLATE, SyntheticSpec, write_synthetic_model
from meshnet.artifact.synthetic_templates import LLAMA3_TOOL_TEMPLATE, QWEN_TOOL_TEMPLATE
from meshnet.engine.constraints import GrammarVocabulary, json_schema_constraint
from meshnet.engine.tokenizer import Tokenizer
from meshnet.gateway.errors import HttpError
from meshnet.gateway.schemas import ChatCompletionBody
from meshnet.gateway.tools.formats import GENERIC, HERMES, LLAMA3_JSON, choose_format
from meshnet.gateway.tools.grammar import call_schema, wrap_call_grammar
from meshnet.gateway.tools.parse import CallPiece, ContentPiece, ToolStreamParser, parse_reply
from meshnet.gateway.tools.plan import ToolPlan, read_tool_plan
from meshnet.gateway.tools.render import template_messages, template_tools
from meshnet.gateway.tools.shape import shape_completion

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def _body(**fields: Any) -> ChatCompletionBody:
    raw = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER, TIME], **fields}
    return ChatCompletionBody.model_validate_json(json.dumps(raw), strict=True)


def _plan(template: str | None = QWEN_TOOL_TEMPLATE, **fields: Any) -> ToolPlan:
    plan = read_tool_plan(_body(**fields), template)
    if plan is None:
        raise AssertionError("a request with tools has a plan")
    return plan


def _ids() -> Any:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def test_the_template_decides_the_format() -> None:
    assert choose_format(QWEN_TOOL_TEMPLATE) is HERMES
    assert choose_format(LLAMA3_TOOL_TEMPLATE) is LLAMA3_JSON
    assert choose_format(TINY_CHAT_TEMPLATE) is GENERIC
    assert choose_format(None) is GENERIC


def test_hermes_reply_keeps_content_before_the_calls_and_never_leaks_the_call() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    reply = parse_reply(text, _plan(), _ids())
    assert reply.content == "Let me look."
    assert [(call.id, call.name, json.loads(call.arguments)) for call in reply.calls] == [
        ("call_0", "get_weather", {"city": "Paris"}),
        ("call_1", "get_time", {}),
    ]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>',  # not one of the tools
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>',  # broken JSON
        '<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>',  # arguments not an object
        "plain words <tool_ca",
    ],
)
def test_what_is_not_a_call_stays_content(text: str) -> None:
    reply = parse_reply(text, _plan(), _ids())
    assert reply.calls == () and reply.content == text


def test_llama3_reply_is_one_bare_object() -> None:
    plan = _plan(LLAMA3_TOOL_TEMPLATE)
    call = parse_reply(' {"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}', plan, _ids())
    assert call.content is None and [c.name for c in call.calls] == ["get_weather"]
    assert json.loads(call.calls[0].arguments) == {"city": "Oslo", "days": 2}
    assert parse_reply("{not json} but words", plan, _ids()).content == "{not json} but words"
    assert parse_reply("Sunny, 21 degrees.", plan, _ids()).calls == ()


@pytest.mark.parametrize("template", [QWEN_TOOL_TEMPLATE, LLAMA3_TOOL_TEMPLATE])
def test_token_by_token_parsing_equals_the_whole(template: str) -> None:
    plan = _plan(template)
    texts = [
        'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
        '{"name": "get_weather", "parameters": {"city": "Rome"}}',
        "The answer is < 3 and <tool> is a word.",
    ]
    for text in texts:
        whole = parse_reply(text, plan, _ids())
        for size in (1, 2, 3, 7):
            parser = ToolStreamParser(plan, _ids())
            pieces = [piece for start in range(0, len(text), size) for piece in parser.push(text[start : start + size])]
            pieces += parser.finish()
            calls = tuple(piece.call for piece in pieces if isinstance(piece, CallPiece))
            content = "".join(piece.text for piece in pieces if isinstance(piece, ContentPiece))
            assert calls == whole.calls
            assert (content or None if calls else content) == whole.content  # the very same text


def test_a_call_cut_short_is_neither_a_call_nor_content() -> None:
    one = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    for cut_next in ('\n<tool_call>\n{"name": "get_weather", "argu', "\n<tool"):
        reply = parse_reply(one + cut_next, _plan(), _ids())
        assert reply.content is None and [call.name for call in reply.calls] == ["get_time"]
    for plan, cut in (
        (_plan(), '<tool_call>\n{"name": "get_weather", "argu'),
        (_plan(), "Let me see.\n<tool_call>\n"),
        (_plan(LLAMA3_TOOL_TEMPLATE), '{"name": "get_weather", "parameters": {"ci'),
        (_plan(LLAMA3_TOOL_TEMPLATE), '<|python_tag|>{"na'),
    ):
        reply = parse_reply(cut, plan, _ids())
        assert reply.calls == () and reply.content == (cut.split("\n")[0] if cut.startswith("Let") else None)
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": cut}, "finish_reason": "length"}]}
    (choice,) = shape_completion(body, _plan(LLAMA3_TOOL_TEMPLATE), _ids())["choices"]
    assert choice == {"index": 0, "message": {"role": "assistant", "content": None}, "finish_reason": "length"}


def test_one_call_is_reported_when_one_was_asked_for() -> None:
    two = (
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    named = {"type": "function", "function": {"name": "get_time"}}
    for fields in ({"parallel_tool_calls": False}, {"tool_choice": named}):
        assert [call.name for call in parse_reply(two, _plan(**fields), _ids()).calls] == ["get_time"]
    assert len(parse_reply(two, _plan(), _ids()).calls) == 2


def test_streamed_content_is_held_back_only_while_it_may_start_a_call() -> None:
    parser = ToolStreamParser(_plan(), _ids())
    assert parser.push("Hello <tool") == [ContentPiece("Hello")]  # the space waits for more content
    assert parser.push("box> now\n") == [ContentPiece(" <toolbox> now")]
    assert parser.push('<tool_call>{"name": "get_time", "arguments": {}}') == []
    (piece,) = parser.push("</tool_call>")
    assert isinstance(piece, CallPiece) and piece.index == 0 and piece.call.name == "get_time"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [], "tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}, None),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"tool_choice": "required", "stop": ["\n"]}, "stop"),
        ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}, "stop": "x"}, "stop"),
    ],
)
def test_bad_tool_requests_are_400s_naming_the_parameter(fields: dict[str, Any], param: str | None) -> None:
    with pytest.raises(HttpError) as refused:
        read_tool_plan(_body(**fields), QWEN_TOOL_TEMPLATE)
    assert refused.value.status == 400
    assert refused.value.param == (param or "tools.0.function.parameters")


def test_choices_and_parallel_calls() -> None:
    assert _plan().mode == "auto" and _plan().active and not _plan().constrained
    assert _plan().lazy_grammar and _plan().grammar  # auto: the call grammar from a call's start
    assert not _plan(response_format={"type": "json_object"}).lazy_grammar  # that grammar holds instead
    assert not _plan(tool_choice="none").active
    named = _plan(tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert named.constrained and [f.name for f in named.callable_functions()] == ["get_time"]
    assert _plan(tool_choice="required").several_calls
    assert not _plan(tool_choice="required", parallel_tool_calls=False).several_calls
    assert not _plan(LLAMA3_TOOL_TEMPLATE, tool_choice="required").several_calls  # one call per turn
    assert read_tool_plan(_body(tools=None), QWEN_TOOL_TEMPLATE) is None


HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
]


def _rendered(template: str | None, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    body = _body(messages=messages)
    plain = [{"role": m.role, "content": m.content if isinstance(m.content, str) else ""} for m in body.messages]
    return template_messages(body.messages, plain, read_tool_plan(body, template))


def test_history_is_given_to_the_template_as_hugging_face_expects() -> None:
    rendered = _rendered(QWEN_TOOL_TEMPLATE, HISTORY)
    assert rendered[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert rendered[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_a", "name": "get_weather"}
    tools = template_tools(_plan())
    assert tools is not None and tools[0]["function"]["name"] == "get_weather"


def test_generic_format_writes_tools_calls_and_results_as_text() -> None:
    rendered = _rendered(TINY_CHAT_TEMPLATE, HISTORY)
    assert rendered[0]["role"] == "system" and '"get_weather"' in rendered[0]["content"]
    assert (
        rendered[2]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert rendered[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    assert template_tools(_plan(TINY_CHAT_TEMPLATE)) is None


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_x", "content": "1"}], "messages.1"),
        (
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "nope"}}],
                },
            ],
            "messages.1",
        ),
    ],
)
def test_bad_tool_history_is_a_400(messages: list[dict[str, Any]], param: str) -> None:
    with pytest.raises(HttpError) as refused:
        _rendered(QWEN_TOOL_TEMPLATE, messages)
    assert refused.value.status == 400 and str(refused.value.param).startswith(param)


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = SyntheticSpec(architecture="qwen2", chat_template=QWEN_TOOL_TEMPLATE)
    return write_synthetic_model(tmp_path_factory.mktemp("qwen") / "qwen.gguf", spec)


@pytest.mark.parametrize("template", [QWEN_TOOL_TEMPLATE, LLAMA3_TOOL_TEMPLATE, TINY_CHAT_TEMPLATE])
def test_the_families_templates_render_a_tool_round(qwen_model: Path, template: str) -> None:
    tokenizer = Tokenizer(describe_model(qwen_model), chat_template=template)
    try:
        body = _body(messages=HISTORY)
        plan = read_tool_plan(body, template)
        plain = [{"role": m.role, "content": m.content or ""} for m in body.messages]
        messages = template_messages(body.messages, plain, plan)
        text = tokenizer.decode(tokenizer.encode_chat(messages, tools=template_tools(plan)))
    finally:
        tokenizer.close()
    assert "get_weather" in text and "Paris" in text and "sunny" in text


def _accepts(vocabulary: GrammarVocabulary, tokenizer: Tokenizer, grammar: str, text: str) -> bool:
    from meshnet.core.sampling_options import OutputConstraint

    matcher = vocabulary.matcher(OutputConstraint(grammar))
    tokens = tokenizer.encode(text, add_special=False)
    if tokenizer.token_bytes(tokens[0]) == b" ":  # SentencePiece's space prefix is not the text's
        tokens = tokens[1:]
    try:
        for token in tokens:
            if not matcher.allows(token):
                return False
            matcher.accept(token)
        return all(matcher.allows(eos) for eos in tokenizer.eos_token_ids)
    finally:
        matcher.close()


def test_the_call_grammar_admits_exactly_calls_of_the_allowed_functions(qwen_model: Path) -> None:
    vocabulary, tokenizer = GrammarVocabulary(qwen_model), Tokenizer(describe_model(qwen_model))
    try:
        one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        time_call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
        for fields, several in (({"tool_choice": "required"}, True), ({"parallel_tool_calls": False}, False)):
            plan = _plan(**fields)
            grammar = wrap_call_grammar(json_schema_constraint(call_schema(plan)).grammar, plan.format, several=several)
            assert _accepts(vocabulary, tokenizer, grammar, one)
            assert _accepts(vocabulary, tokenizer, grammar, f"{one}\n{time_call}") is several
            assert not _accepts(vocabulary, tokenizer, grammar, '<tool_call>\n{"name": "get_weather"}\n</tool_call>')
            assert not _accepts(vocabulary, tokenizer, grammar, "Sunny.")
        named = _plan(tool_choice={"type": "function", "function": {"name": "get_time"}})
        grammar = wrap_call_grammar(json_schema_constraint(call_schema(named)).grammar, named.format, several=False)
        assert _accepts(vocabulary, tokenizer, grammar, time_call) and not _accepts(vocabulary, tokenizer, grammar, one)
        llama = _plan(LLAMA3_TOOL_TEMPLATE, tool_choice="required")
        grammar = wrap_call_grammar(json_schema_constraint(call_schema(llama)).grammar, llama.format, several=False)
        assert _accepts(vocabulary, tokenizer, grammar, '{"name": "get_time", "parameters": {}}')
    finally:
        vocabulary.close()
        tokenizer.close()


def test_the_completion_object_carries_calls_and_their_finish_reason() -> None:
    text = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
    (choice,) = shape_completion(body, _plan(), _ids())["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}],
    }
