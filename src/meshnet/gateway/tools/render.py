"""What the model's own chat template is given for a chat with tools.

Templates that know tools (``ToolFormat.template_renders_tools``) get OpenAI's shapes as
Hugging Face templates expect them: ``tools`` as a list of ``{"type": "function", "function":
...}``, assistant turns with ``tool_calls`` whose ``arguments`` are objects (not strings), and
``tool`` turns with ``tool_call_id`` (and the function's ``name``). For the ``GENERIC`` format the
tools become a system preamble, past calls become assistant text in the Hermes tags and tool
results a user turn in ``<tool_response>`` tags, so any template renders them as content.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from meshnet.gateway.errors import bad_request
from meshnet.gateway.schemas import ChatMessage, ToolCallIn
from meshnet.gateway.tools.formats import generic_preamble
from meshnet.gateway.tools.plan import ToolPlan

TemplateMessage = dict[str, Any]


def template_tools(plan: ToolPlan | None) -> list[dict[str, Any]] | None:
    """The ``tools`` the template renders; None when it renders none."""
    if plan is None or not plan.active or not plan.format.template_renders_tools:
        return None
    return [{"type": "function", "function": function.openai_json()} for function in plan.functions]


def template_messages(
    messages: Sequence[ChatMessage], plain: Sequence[Mapping[str, str]], plan: ToolPlan | None
) -> list[TemplateMessage]:
    """The messages for the template: ``plain`` (role and text of each) plus the tool fields."""
    if plan is None:
        return [dict(message) for message in plain]
    called: dict[str, str] = {}
    rendered: list[TemplateMessage] = []
    previous_tool = False
    for index, (message, text) in enumerate(zip(messages, plain, strict=True)):
        if message.role == "tool":
            result = _tool_result(index, message, text["content"], called, plan)
            if previous_tool and not plan.format.template_renders_tools:  # one user turn per tool round
                rendered[-1] = {**rendered[-1], "content": rendered[-1]["content"] + "\n" + result["content"]}
            else:
                rendered.append(result)
            previous_tool = True
            continue
        previous_tool = False
        entry: TemplateMessage = dict(text)
        if message.tool_calls:
            if message.role != "assistant":
                raise bad_request("invalid_parameter", "only assistant messages carry tool_calls", f"messages.{index}")
            calls = [_call(index, number, call) for number, call in enumerate(message.tool_calls)]
            called.update((call.id, call.function.name) for call in message.tool_calls)
            entry = _with_calls(entry, calls, plan)
        rendered.append(entry)
    return _generic(rendered, plan) if not plan.format.template_renders_tools else rendered


def _call(index: int, number: int, call: ToolCallIn) -> dict[str, Any]:
    try:
        arguments = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):
        raise bad_request(
            "invalid_parameter",
            "a tool call's arguments must be a JSON object in a string",
            f"messages.{index}.tool_calls.{number}.function.arguments",
        )
    return {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}}


def _with_calls(entry: TemplateMessage, calls: list[dict[str, Any]], plan: ToolPlan) -> TemplateMessage:
    if plan.format.template_renders_tools:
        return {**entry, "tool_calls": calls}
    written = [plan.format.call_text(call["function"]["name"], call["function"]["arguments"]) for call in calls]
    return {**entry, "content": "\n".join(part for part in [entry["content"], *written] if part)}


def _tool_result(
    index: int, message: ChatMessage, content: str, called: Mapping[str, str], plan: ToolPlan
) -> TemplateMessage:
    call_id = message.tool_call_id
    if call_id is None or call_id not in called:
        raise bad_request(
            "invalid_parameter",
            "a tool message must answer a tool call of an earlier assistant message (tool_call_id)",
            f"messages.{index}.tool_call_id",
        )
    if not plan.format.template_renders_tools:
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    return {"role": "tool", "content": content, "tool_call_id": call_id, "name": called[call_id]}


def _generic(rendered: list[TemplateMessage], plan: ToolPlan) -> list[TemplateMessage]:
    """The tools listed in a system preamble (joined to a leading system message)."""
    if not plan.active:
        return rendered
    preamble = generic_preamble([function.openai_json() for function in plan.functions])
    if rendered and rendered[0]["role"] == "system":
        return [{**rendered[0], "content": f"{preamble}\n\n{rendered[0]['content']}"}, *rendered[1:]]
    return [{"role": "system", "content": preamble}, *rendered]
