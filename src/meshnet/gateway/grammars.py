"""Grammars of ``response_format: json_schema``, built in a child process under a deadline.

llama.cpp's JSON-schema converter is pure Python CPU work: on the event loop one hostile schema
stalled every client of the gateway (4 s per request). Here the schema's size is first bounded
from the schema itself (``engine.grammar_bound``: a 400 ``grammar_too_large`` naming the limit,
at once), then the grammar is built by one long-lived ``meshnet.engine.grammar_process`` child,
one schema at a time. An answer later than ``grammar_timeout_seconds`` is a 400
``grammar_too_complex``, and the child is killed: the next schema starts a fresh one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Mapping
from typing import Any

from meshnet.core.errors import EngineError, GrammarTooComplex, GrammarTooLarge, InvalidArgument, MeshnetError
from meshnet.core.sampling_options import OutputConstraint
from meshnet.engine.grammar_bound import check_grammar_size
from meshnet.engine.grammar_process import MODULE

logger = logging.getLogger(__name__)

LINE_LIMIT = 16 << 20
"""Longest answer line read from the child (a grammar is at most 32 KiB; JSON escapes add some)."""


class GrammarBuilder:
    """The gateway's grammar child: started on the first schema, replaced after a late answer."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._child: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _follow_loop(self) -> None:
        """Pipes and locks belong to one event loop: an app moved to another (a test client's
        portal) starts over there, leaving the old child to the old loop's end."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._abandon()  # its pipes die with the old loop
            self._loop, self._lock = loop, asyncio.Lock()

    async def json_schema(self, schema: Mapping[str, Any]) -> OutputConstraint:
        """The constraint of ``schema``; typed errors (InvalidArgument and its kinds) for bad ones."""
        check_grammar_size(schema)  # cheap and certain: refused before any process is asked
        request = (json.dumps({"schema": schema}) + "\n").encode()
        self._follow_loop()
        async with self._lock:
            try:
                reply = await asyncio.wait_for(self._ask(request), self._timeout_s)
            except TimeoutError:
                await self._stop()
                raise GrammarTooComplex(
                    f"the JSON schema's grammar was not built within {self._timeout_s:g} s; simplify the schema"
                ) from None
            except (OSError, ValueError, asyncio.IncompleteReadError) as error:
                await self._stop()
                raise EngineError(f"the grammar process failed: {error!r}") from None
            except asyncio.CancelledError:
                # The caller went away mid-build: the answer still on its way must never be read
                # as the next schema's, so that child goes.
                self._abandon()
                raise
        return _constraint(reply)

    async def _ask(self, request: bytes) -> dict[str, Any]:
        child = self._child
        if child is None or child.returncode is not None:
            child = self._child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                MODULE,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=LINE_LIMIT,
            )
        if child.stdin is None or child.stdout is None:
            raise ValueError("the grammar process has no pipes")
        child.stdin.write(request)
        await child.stdin.drain()
        line = await child.stdout.readline()
        if not line:
            raise ValueError("the grammar process closed its output")
        reply = json.loads(line)
        if not isinstance(reply, dict):
            raise ValueError("the grammar process answered something other than an object")
        return reply

    def _abandon(self) -> None:
        child, self._child = self._child, None
        if child is not None and child.returncode is None:
            child.kill()  # reaped by asyncio's child watcher

    async def _stop(self) -> None:
        child, self._child = self._child, None
        if child is None or child.returncode is not None:
            return
        logger.warning("stopping the grammar process %d (late or broken answer)", child.pid)
        child.kill()
        await child.wait()

    async def close(self) -> None:
        if self._loop is asyncio.get_running_loop():
            async with self._lock:
                await self._stop()


def _constraint(reply: Mapping[str, Any]) -> OutputConstraint:
    grammar = reply.get("grammar")
    if isinstance(grammar, str):
        return OutputConstraint(grammar)
    code, message = str(reply.get("code", "")), str(reply.get("message", "the grammar could not be built"))
    error_type = next((kind for kind in _ERRORS if kind.code == code), InvalidArgument)
    error: MeshnetError = error_type(message)
    raise error


_ERRORS: tuple[type[InvalidArgument], ...] = (InvalidArgument, GrammarTooLarge, GrammarTooComplex)
