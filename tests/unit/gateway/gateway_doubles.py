"""Test doubles for the gateway: a byte-level codec and a scripted, deterministic route generator.

They live only in tests/. The generator stands in for the route's network side only (tracker,
shards): its scripted events go through the real ``route.life.RequestLife`` in the same loop the
swarm client runs, so every finish the gateway shows is decided by the real code. It records
every request, how each event iterator ended (ran to the end, ``aclose``d, cancelled) and can be
told to fail before or after a given token, to wait on a gate, or to go slowly, so each gateway
path can be driven on purpose.

What the doubles cannot show: the text is bytes, not a model's tokens (``ByteCodec`` is no
tokenizer, no chat template), and no tracker, shard, gRPC status, failover or timing of a real
route stands behind the scripted events. Those are covered with real worker processes behind a
real gateway in tests/integration (test_swarm_openai*.py for the API and tokenizer,
test_swarm_failover.py for failures and failover, test_swarm_admission.py and
test_gateway_queue_load.py for admission under load) and with SmolLM2 in
tests/model/test_swarm_real.py.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshnet.core.events import (
    DecodeStarted,
    GenerationEvent,
    PrefillCompleted,
    PrefillStarted,
    RouteAccepted,
    RouteHealth,
    RouteHop,
    TokenGenerated,
)
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.gateway.app import create_app
from meshnet.gateway.config import GatewayConfig
from meshnet.gateway.ports import ModelCard
from meshnet.gateway.server import GatewayServer
from meshnet.route.life import LifeSink, RequestLife, TextPlug, lifetime

MODEL = "tiny-test"
BOS, EOS, OFFSET = 0, 1, 2

HOP_CAPABILITY = NodeCapability(2048, 256, 2048, 4 << 20, 64, 8)
"""What each scripted route hop carries (the scripted generator never sizes frames by it)."""


class ByteDecoder:
    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if token_id < OFFSET:
            return ""
        return self._utf8.decode(bytes([token_id - OFFSET]))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


@dataclass(frozen=True)
class ByteCodec:
    """One token per UTF-8 byte (id = byte + 2); 0 is BOS, 1 is EOS."""

    context_length: int = 256
    eos_token_ids: frozenset[int] = frozenset({EOS})
    vocab_size: int = 256 + OFFSET
    embedding_width: int = 3
    """The scripted embedder's vectors (tests/unit/gateway/test_gateway_embeddings.py) have 3 values."""
    chat_template_source: str | None = None
    """No Jinja template: tools take the generic format (written into the messages as text)."""

    def encode(self, text: str, *, add_special: bool) -> list[int]:
        return [BOS] * add_special + [byte + OFFSET for byte in text.encode()]

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        body = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return body + ("<assistant>" if add_generation_prompt else "")

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        return self.encode(
            self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt), add_special=False
        )

    def encode_chat_continuation(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        opened = self.apply_chat_template(messages[:-1], add_generation_prompt=True)
        return self.encode(opened + messages[-1]["content"], add_special=False)

    def new_decoder(self) -> ByteDecoder:
        return ByteDecoder()

    def token_bytes(self, token_id: int) -> bytes:
        return b"" if token_id < OFFSET else bytes([token_id - OFFSET])


@dataclass
class Script:
    """What the scripted route does for every request."""

    text: str = "Hello world"
    """Sent one token per byte, then EOS."""
    fail_before: BaseException | None = None
    fail_after_tokens: int | None = None
    failure: BaseException | None = None
    token_delay: float = 0.0
    gate: asyncio.Event | None = None
    gate_after_tokens: int | None = None
    """Where the route waits for ``gate``: before anything (None) or after that many tokens."""
    health_after_tokens: int | None = None


@dataclass
class ScriptedGenerator:
    script: Script = field(default_factory=Script)
    cards: tuple[ModelCard, ...] = (ModelCard(MODEL, "Q8_0", 256),)
    requests: list[tuple[GenerationRequest, RequestId]] = field(default_factory=list)
    endings: dict[RequestId, str] = field(default_factory=dict)
    """How each iterator ended: "finished", "aclose", "cancelled" or "raised"."""
    tokens_sent: dict[RequestId, int] = field(default_factory=dict)
    slots: int | None = None
    """What ``session_slots`` reports: the swarm's size, for limits left unset."""

    def models(self) -> Sequence[ModelCard]:
        return self.cards

    async def session_slots(self) -> int | None:
        return self.slots

    async def serve(self, request: GenerationRequest, request_id: RequestId, text: TextPlug, sink: LifeSink) -> None:
        self.requests.append((request, request_id))
        life = RequestLife(request, text, sink)
        async with lifetime(life), contextlib.aclosing(self._run(request, request_id)) as events:
            async for event in events:
                if life.observe(event):
                    return

    async def _run(self, request: GenerationRequest, request_id: RequestId) -> AsyncGenerator[GenerationEvent, None]:
        script = self.script
        ending = "raised"
        try:
            if script.gate is not None and script.gate_after_tokens is None:
                await script.gate.wait()
            if script.fail_before is not None:
                raise script.fail_before
            async for event in self._events(script, request, request_id):
                yield event
            ending = "finished"
        except GeneratorExit:
            ending = "aclose"
            raise
        except asyncio.CancelledError:
            ending = "cancelled"
            raise
        finally:
            self.endings[request_id] = ending

    async def _events(
        self, script: Script, request: GenerationRequest, request_id: RequestId
    ) -> AsyncIterator[GenerationEvent]:
        prompt = len(request.prompt_tokens)
        hops = (
            RouteHop(NodeId("node-a"), "127.0.0.1:5001", LayerRange(0, 12), HOP_CAPABILITY),
            RouteHop(NodeId("node-b"), "127.0.0.1:5002", LayerRange(12, 24), HOP_CAPABILITY),
        )
        yield RouteAccepted(request_id, SessionId("s-test"), MODEL, "Q8_0", hops, epoch=3)
        yield PrefillStarted(prompt)
        yield PrefillCompleted(prompt, 0.01)
        yield DecodeStarted()
        tokens = [*(byte + OFFSET for byte in script.text.encode()), EOS][: request.max_tokens]
        for index, token in enumerate(tokens):
            if script.fail_after_tokens == index and script.failure is not None:
                raise script.failure
            if script.gate is not None and script.gate_after_tokens == index:
                await script.gate.wait()
            if script.health_after_tokens == index:
                yield RouteHealth("failover", "node-b lost; replayed onto node-c")
            if script.token_delay:
                await asyncio.sleep(script.token_delay)
            self.tokens_sent[request_id] = index + 1
            yield TokenGenerated(token, index, tokens_per_second=10.0 + index)
        if script.fail_after_tokens == len(tokens) and script.failure is not None:
            raise script.failure


def test_config(**overrides: object) -> GatewayConfig:
    base: dict[str, object] = {
        "progress_every_tokens": 4,
        "progress_interval_seconds": 1e6,  # token-count throttle only: deterministic
        "max_in_flight": 4,
        "max_queue": 0,
        "telemetry_max_requests": 16,
        "request_timeout_seconds": 5.0,
        "shutdown_grace_seconds": 1.0,
    }
    base.update(overrides)
    return GatewayConfig(**base)  # type: ignore[arg-type]


def make_app(  # type: ignore[no-untyped-def]
    generator: ScriptedGenerator,
    codec: ByteCodec | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    **overrides: object,
):
    """The real gateway app over the double; ``clock`` is its monotonic clock (inject one to
    move time in a test instead of sleeping)."""
    return create_app(generator, {MODEL: codec or ByteCodec()}, test_config(**overrides), clock=clock)


@contextlib.asynccontextmanager
async def live_server(app: object) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1, a free port; yield its base URL."""
    server = GatewayServer(app, "127.0.0.1", 0, shutdown_grace_seconds=1.0)  # type: ignore[arg-type]
    port = await server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await server.stop()


@dataclass(frozen=True)
class RawStream:
    """A completion stream as a raw SSE parser sees it."""

    data: list[str]
    telemetry: list[dict[str, object]]

    @property
    def chunks(self) -> list[dict[str, object]]:
        return [json.loads(item) for item in self.data if item != "[DONE]"]


def parse_raw_sse(text: str) -> RawStream:
    data: list[str] = []
    telemetry: list[dict[str, object]] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data.append(line[len("data: ") :])
        elif line.startswith(": telemetry "):
            telemetry.append(json.loads(line[len(": telemetry ") :]))
    return RawStream(data, telemetry)


async def wait_until(predicate: object, timeout: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():  # type: ignore[operator]
        if loop.time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)
