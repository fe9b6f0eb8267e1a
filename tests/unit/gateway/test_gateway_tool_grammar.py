"""The tool-call grammar built for real (llama.cpp's converter in the gateway's grammar child):
nested ``$defs`` lifted per function, ``auto`` without its grammar when that cannot be built,
built grammars kept by schema text."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import jsonschema
import pytest

from meshnet.artifact.synthetic_templates import QWEN_TOOL_TEMPLATE
from meshnet.engine.constraints import ANCHOR, json_schema_constraint
from meshnet.gateway.errors import HttpError
from meshnet.gateway.grammars import GrammarBuilder
from meshnet.gateway.schemas import ChatCompletionBody
from meshnet.gateway.tools.formats import HERMES, LLAMA3_JSON
from meshnet.gateway.tools.grammar import build_tool_constraint, call_schema, lazy_triggers, lift_definitions
from meshnet.gateway.tools.plan import ToolPlan, read_tool_plan

CITY = {"type": "object", "properties": {"name": {"type": "string"}, "unit": {"$ref": "#/$defs/Unit"}}}
NESTED = {  # what openai.pydantic_function_tool writes for a nested model with an enum
    "$defs": {"City": CITY, "Unit": {"enum": ["c", "f"], "type": "string"}},
    "properties": {"city": {"$ref": "#/$defs/City"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "type": "object",
}
OLD_STYLE = {"definitions": {"Unit": {"enum": ["k"]}}, "properties": {"u": {"$ref": "#/definitions/Unit"}}}


def _tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", **parameters}}}


def _plan(tools: list[dict[str, Any]], **fields: Any) -> ToolPlan:
    raw = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools, **fields}
    plan = read_tool_plan(ChatCompletionBody.model_validate_json(json.dumps(raw), strict=True), QWEN_TOOL_TEMPLATE)
    if plan is None:
        raise AssertionError("a request with tools has a plan")
    return plan


def test_each_functions_definitions_are_lifted_under_its_own_prefix() -> None:
    rest, lifted = lift_definitions(NESTED, "f0-")
    assert "$defs" not in rest and rest["properties"]["city"] == {"$ref": "#/$defs/f0-City"}
    assert lifted["f0-City"]["properties"]["unit"] == {"$ref": "#/$defs/f0-Unit"}
    schema = call_schema(_plan([_tool("a", NESTED), _tool("b", OLD_STYLE)]))
    assert set(schema["$defs"]) == {"f0-City", "f0-Unit", "f1-Unit"}
    call = {"name": "a", "arguments": {"city": {"name": "Oslo", "unit": "c"}, "days": 2}}
    jsonschema.validate(call, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**call, "arguments": {"city": {"unit": "k"}, "days": 2}}, schema)
    grammar = json_schema_constraint(schema).grammar  # the converter resolves every reference
    assert "f0-City" in grammar and "f1-Unit" in grammar


def _many_tools(count: int) -> list[dict[str, Any]]:
    properties = {
        "query": {"type": "string"},
        "limit": {"type": "integer"},
        "order": {"enum": ["asc", "desc", "relevance"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "verbose": {"type": "boolean"},
    }
    return [_tool(f"tool_number_{index}", {"properties": properties, "required": ["query"]}) for index in range(count)]


def test_auto_drops_a_grammar_it_cannot_build_and_required_refuses_it(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        builder = GrammarBuilder(timeout_s=30.0)
        try:
            with caplog.at_level(logging.INFO, logger="meshnet.gateway.tools.grammar"):
                assert await build_tool_constraint(_plan(_many_tools(40)), builder) is None
            assert "grammar_too_large" in caplog.text
            with pytest.raises(HttpError) as refused:
                await build_tool_constraint(_plan(_many_tools(40), tool_choice="required"), builder)
            assert refused.value.status == 400 and refused.value.code == "grammar_too_large"
            remote = _plan([_tool("r", {"properties": {"x": {"$ref": "https://example.com/x.json"}}})])
            assert await build_tool_constraint(remote, builder) is None  # unbuildable: auto answers free
        finally:
            await builder.close()

    asyncio.run(run())


def test_built_grammars_are_kept_by_schema_text() -> None:
    async def run() -> None:
        builder = GrammarBuilder(timeout_s=30.0)
        try:
            plan = _plan([_tool("a", NESTED)])
            first = await build_tool_constraint(plan, builder)
            again = await asyncio.gather(*(build_tool_constraint(plan, builder) for _ in range(5)))
            assert first is not None and all(built == first for built in again)
            assert builder.builds == 1 and first.triggers == ("<tool_call>",)
            await build_tool_constraint(_plan([_tool("a", NESTED)], tool_choice="required"), builder)
            assert builder.builds == 1  # the same call schema: only the wrapping differs
        finally:
            await builder.close()

    asyncio.run(run())


def test_llama3s_trigger_is_anchored_where_the_parser_looks_for_a_call() -> None:
    assert lazy_triggers(HERMES) == ("<tool_call>",)
    assert lazy_triggers(LLAMA3_JSON) == (ANCHOR + '{"name"',)


def test_the_cache_keeps_the_schemas_property_order() -> None:
    # The converter writes properties in the schema's order: schemas equal but for it are two.
    integer = {"type": "integer"}

    async def run() -> list[str]:
        builder = GrammarBuilder(timeout_s=30.0)
        try:
            orders = ({"b": integer, "a": integer}, {"a": integer, "b": integer})
            schemas = [{"type": "object", "properties": order, "required": ["a", "b"]} for order in orders]
            return [(await builder.json_schema(schema)).grammar for schema in schemas]
        finally:
            await builder.close()

    roots = [
        next(line for line in grammar.splitlines() if line.startswith("root ::=")) for grammar in asyncio.run(run())
    ]
    assert roots[0].index("b-kv") < roots[0].index("a-kv") and roots[1].index("a-kv") < roots[1].index("b-kv")
