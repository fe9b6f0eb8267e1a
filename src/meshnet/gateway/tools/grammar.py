"""The grammar of a required or named tool call: the family's call syntax around the arguments.

The call object (``{"name": <one of the functions>, "arguments": <its parameters schema>}``,
``parameters`` for Llama 3) is one JSON schema, turned into GBNF by the ``json_schema``
machinery (``gateway/grammars.GrammarBuilder``: bounded, cached, off the event loop, under a
deadline); its ``root`` rule is renamed ``tool-call`` and wrapped in the format's tags. With
``parallel_tool_calls`` (and a family that allows it) several calls may follow each other,
otherwise exactly one; the grammar then ends, so the tail can only stop there. For ``auto`` the
same grammar is lazy: free text until the format's call start (``<tool_call>``, ``{"name"``),
then the call grammar from that word on (``engine.constraints.LazyGrammarMatcher``).

Each function's ``$defs`` / ``definitions`` (what ``openai.pydantic_function_tool`` writes for
every nested model or enum) are lifted to the root of the call schema under a per-function
prefix, and the function's ``$ref``s rewritten to match: inside the call schema its parameters
sit under ``properties.arguments``, where ``#/$defs/...`` would no longer resolve.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from meshnet.core.errors import EngineError, InvalidArgument
from meshnet.core.sampling_options import OutputConstraint
from meshnet.engine.constraints import ANCHOR
from meshnet.gateway.errors import bad_request
from meshnet.gateway.grammars import GrammarBuilder
from meshnet.gateway.tools.formats import ToolFormat
from meshnet.gateway.tools.plan import ToolPlan

logger = logging.getLogger(__name__)

CALL_RULE = "tool-call"
_ROOT_LINE = re.compile(r"^root ::=", re.MULTILINE)
_DEFINITIONS = ("$defs", "definitions")


def lift_definitions(parameters: Mapping[str, Any], prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``parameters`` without its definitions, and those definitions named ``prefix + name``;
    every local ``$ref`` to one of them (in both) rewritten to ``#/$defs/<prefix><name>``."""
    names: dict[str, str] = {}
    lifted: dict[str, Any] = {}
    for keyword in _DEFINITIONS:
        found = parameters.get(keyword)
        if isinstance(found, Mapping):
            for name, definition in found.items():
                names[f"#/{keyword}/{name}"] = f"#/$defs/{prefix}{name}"
                lifted[f"{prefix}{name}"] = definition
    rest = {key: value for key, value in parameters.items() if key not in _DEFINITIONS}
    return _rewrite(rest, names), {key: _rewrite(value, names) for key, value in lifted.items()}


def _rewrite(value: Any, names: Mapping[str, str]) -> Any:
    if isinstance(value, Mapping):
        return {
            key: names.get(item, item) if key == "$ref" and isinstance(item, str) else _rewrite(item, names)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_rewrite(item, names) for item in value]
    return value


def call_schema(plan: ToolPlan) -> dict[str, Any]:
    """The JSON schema of one call object of any function the reply may call."""
    key = plan.format.arguments_key
    shapes: list[dict[str, Any]] = []
    definitions: dict[str, Any] = {}
    for index, function in enumerate(plan.callable_functions()):
        parameters, lifted = lift_definitions(function.parameters, f"f{index}-")
        definitions.update(lifted)
        shapes.append(
            {
                "type": "object",
                "properties": {"name": {"const": function.name}, key: parameters},
                "required": ["name", key],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
    return {**schema, "$defs": definitions} if definitions else schema


def wrap_call_grammar(call_grammar: str, fmt: ToolFormat, *, several: bool) -> str:
    """The whole reply's grammar from the grammar of one call object (its root rule)."""
    renamed = _ROOT_LINE.sub(f"{CALL_RULE} ::=", call_grammar)
    if not fmt.open_tag:
        return f"root ::= {CALL_RULE}\n{renamed}"
    one = f"{json.dumps(fmt.open_tag + chr(10))} {CALL_RULE} {json.dumps(chr(10) + fmt.close_tag)}"
    repeat = f' ("\\n" {one})*' if several else ""
    return f"root ::= {one}{repeat}\n{renamed}"


def lazy_triggers(fmt: ToolFormat) -> tuple[str, ...]:
    """Where ``auto``'s lazy grammar engages: anywhere for tagged formats; for a bare-object
    format (Llama 3) only at the reply's start, where the parser looks for a call too."""
    return (fmt.trigger,) if fmt.open_tag else (ANCHOR + fmt.trigger,)


async def build_tool_constraint(plan: ToolPlan | None, grammars: GrammarBuilder) -> OutputConstraint | None:
    """The grammar a required or named tool choice puts on the reply, or for ``auto`` the same
    grammar made lazy (engaging at the format's call start); None otherwise.

    A required / named grammar that cannot be built is the client's 400. ``auto`` needs no
    grammar to answer: one too large, too complex or not buildable is dropped (logged) and the
    reply is parsed for unconstrained calls, as before the grammar existed."""
    if plan is None or not plan.grammar:
        return None
    triggers = () if plan.constrained else lazy_triggers(plan.format)
    try:
        built = await grammars.json_schema(call_schema(plan))
        grammar = wrap_call_grammar(built.grammar, plan.format, several=plan.several_calls)
        return OutputConstraint(grammar, triggers=triggers)
    except InvalidArgument as err:
        if plan.constrained:
            raise bad_request(err.code, f"tools: {err.message}", "tools") from None
        _dropped(err)
    except EngineError as err:
        if plan.constrained:
            raise
        _dropped(err)
    return None


def _dropped(err: InvalidArgument | EngineError) -> None:
    logger.info("tool_choice auto without its lazy call grammar (%s: %s); calls parsed unconstrained", err.code, err)
