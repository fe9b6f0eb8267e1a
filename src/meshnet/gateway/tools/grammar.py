"""The grammar of a required or named tool call: the family's call syntax around the arguments.

The call object (``{"name": <one of the functions>, "arguments": <its parameters schema>}``,
``parameters`` for Llama 3) is one JSON schema, turned into GBNF by the ``json_schema``
machinery (``gateway/grammars.GrammarBuilder``: bounded, off the event loop, under a deadline);
its ``root`` rule is renamed ``tool-call`` and wrapped in the format's tags. With
``parallel_tool_calls`` (and a family that allows it) several calls may follow each other,
otherwise exactly one; the grammar then ends, so the tail can only stop there.
"""

from __future__ import annotations

import json
import re
from typing import Any

from meshnet.core.errors import InvalidArgument
from meshnet.core.sampling_options import OutputConstraint
from meshnet.gateway.errors import bad_request
from meshnet.gateway.grammars import GrammarBuilder
from meshnet.gateway.tools.formats import ToolFormat
from meshnet.gateway.tools.plan import ToolPlan

CALL_RULE = "tool-call"
_ROOT_LINE = re.compile(r"^root ::=", re.MULTILINE)


def call_schema(plan: ToolPlan) -> dict[str, Any]:
    """The JSON schema of one call object of any function the reply may call."""
    key = plan.format.arguments_key
    shapes = [
        {
            "type": "object",
            "properties": {"name": {"const": function.name}, key: function.parameters},
            "required": ["name", key],
            "additionalProperties": False,
        }
        for function in plan.callable_functions()
    ]
    return shapes[0] if len(shapes) == 1 else {"anyOf": shapes}


def wrap_call_grammar(call_grammar: str, fmt: ToolFormat, *, several: bool) -> str:
    """The whole reply's grammar from the grammar of one call object (its root rule)."""
    renamed = _ROOT_LINE.sub(f"{CALL_RULE} ::=", call_grammar)
    if not fmt.open_tag:
        return f"root ::= {CALL_RULE}\n{renamed}"
    one = f"{json.dumps(fmt.open_tag + chr(10))} {CALL_RULE} {json.dumps(chr(10) + fmt.close_tag)}"
    repeat = f' ("\\n" {one})*' if several else ""
    return f"root ::= {one}{repeat}\n{renamed}"


async def build_tool_constraint(plan: ToolPlan | None, grammars: GrammarBuilder) -> OutputConstraint | None:
    """The grammar a required or named tool choice puts on the reply; None otherwise."""
    if plan is None or not plan.constrained:
        return None
    try:
        built = await grammars.json_schema(call_schema(plan))
        return OutputConstraint(wrap_call_grammar(built.grammar, plan.format, several=plan.several_calls))
    except InvalidArgument as err:
        raise bad_request(err.code, f"tools: {err.message}", "tools") from None
