"""Grammars of ``response_format: json_schema``, built in a child process under a deadline.

llama.cpp's JSON-schema converter is pure Python CPU work: on the event loop one hostile schema
stalled every client of the gateway (4 s per request). Here the schema's size is first bounded
from the schema itself (``engine.grammar_bound``: a 400 ``grammar_too_large`` naming the limit,
at once), then the grammar is built by one long-lived ``meshnet.engine.grammar_process`` child,
one schema at a time. An answer later than ``grammar_timeout_seconds`` is a 400
``grammar_too_complex``, and the child is killed: the next schema starts a fresh one.

Built grammars (and the typed refusals of schemas that cannot be built) are kept by schema text
in a bounded LRU (``CACHE_ENTRIES``): an agent sends the same tools with every turn, and each
would otherwise wait on the one child in turn.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from meshnet.core.errors import EngineError, GrammarTooComplex, GrammarTooLarge, InvalidArgument, MeshnetError
from meshnet.core.sampling_options import OutputConstraint
from meshnet.engine.grammar_bound import check_grammar_size
from meshnet.engine.grammar_process import MODULE

logger = logging.getLogger(__name__)

LINE_LIMIT = 16 << 20
"""Longest answer line read from the child (a grammar is at most 32 KiB; JSON escapes add some)."""
CACHE_ENTRIES = 128
"""Schemas whose outcome is kept (a grammar is at most 32 KiB: 4 MiB at most in all)."""

Built = OutputConstraint | InvalidArgument


class GrammarBuilder:
    """The gateway's grammar child: started on the first schema, replaced after a late answer."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._child: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cache: OrderedDict[str, Built] = OrderedDict()
        self.builds = 0
        """Schemas sent to the child (the cache's misses)."""

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
        text = json.dumps(schema)  # key order kept: it is the order the grammar writes properties in
        self._follow_loop()
        built = self._cached(text)
        if built is None:
            async with self._lock:  # one schema at a time; it may have been built while waiting
                built = self._cached(text) or await self._build(text)
        if isinstance(built, InvalidArgument):
            raise type(built)(built.message)
        return built

    def _cached(self, text: str) -> Built | None:
        built = self._cache.get(text)
        if built is not None:
            self._cache.move_to_end(text)
        return built

    async def _build(self, text: str) -> Built:
        """The child's answer for one schema, kept (under the lock: one schema at a time)."""
        request = f'{{"schema": {text}}}\n'.encode()
        self.builds += 1
        try:
            built: Built = _constraint(await asyncio.wait_for(self._ask(request), self._timeout_s))
        except InvalidArgument as refused:
            built = refused
        except TimeoutError:  # not kept: a busy machine may build it in time later
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
        self._cache[text] = built
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return built

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
    """The child's grammar, or its refusal raised as the typed error it names."""
    grammar = reply.get("grammar")
    if isinstance(grammar, str):
        return OutputConstraint(grammar)
    code, message = str(reply.get("code", "")), str(reply.get("message", "the grammar could not be built"))
    error_type = next((kind for kind in _ERRORS if kind.code == code), InvalidArgument)
    error: MeshnetError = error_type(message)
    raise error


_ERRORS: tuple[type[InvalidArgument], ...] = (InvalidArgument, GrammarTooLarge, GrammarTooComplex)
