"""Tools / function calling for the chat surface (and any endpoint that needs it, e.g. Responses).

The importable API, each a pure function or frozen value:
- ``plan.read_tool_plan(body, template_source)`` -> ``ToolPlan`` or None: the request's tools,
  ``tool_choice`` and ``parallel_tool_calls`` checked (OpenAI-shaped 400s), with the family's
  ``ToolFormat`` chosen from the chat template (``formats.choose_format``);
- ``render.template_messages(messages, contents, plan)`` and ``render.template_tools(plan)``:
  what the model's own chat template is given (assistant ``tool_calls``, ``tool`` turns);
- ``grammar.build_tool_constraint(plan, grammars)``: for ``required`` or a named function, the
  GBNF grammar of the family's call syntax around the functions' argument schemas;
- ``parse.parse_reply(text, plan)`` and ``parse.ToolStreamParser``: generated text back into
  OpenAI ``tool_calls``, whole or token by token;
- ``shape``: the chat completion objects and stream chunks that carry them.
"""
