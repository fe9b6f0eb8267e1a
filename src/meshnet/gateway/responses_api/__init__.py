"""The OpenAI Responses API (``POST /v1/responses``), served by translating to a chat request.

``body``: the request schema and its translation to a ``ChatCompletionBody`` (so generation,
grammars and limits are the chat path's, not a fork); ``shape``: the ``response`` object and
the streaming events the official SDK reads.
"""
