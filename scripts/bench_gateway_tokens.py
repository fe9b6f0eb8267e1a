"""Per-token overhead between the route client and the HTTP response, in process.

    python scripts/bench_gateway_tokens.py [--tokens 2000] [--rounds 9]

The real gateway app and the real swarm client serve chat completions whose route is a double:
a driver that yields ``--tokens`` tokens, suspending once per token as a network read does, over
a tracker double with one route (no shards, no sockets). The body is read through httpx's ASGI
transport. What is measured is what the gateway and the route client add per token: the request
life, the per-request queue, the SSE framing (streamed) or the collector (not streamed); the
medians of ``--rounds`` requests after one warm-up are printed as microseconds per token.
Nothing here is a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import statistics
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from meshnet.core.events import RouteHop, TokenGenerated
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId, RequestId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.core.tracking import Route
from meshnet.gateway.app import create_app
from meshnet.gateway.config import GatewayConfig
from meshnet.gateway.ports import ModelCard
from meshnet.route.life import LifeSink, TextPlug
from meshnet.route.swarm import SwarmClient, SwarmConfig

MODEL = "bench"
OFFSET = 2
"""Token id = byte + 2 (0 and 1 are BOS and EOS), as the gateway's unit-test codec."""
HOP = RouteHop(NodeId("node-a"), "127.0.0.1:1", LayerRange(0, 2), NodeCapability(1 << 20, 256, 1 << 20, 4 << 20, 64, 8))


class _Tracker:
    async def choose_route(self, model: str, *, session_id: Any = None, exclude: Any = (), **_: object) -> Route:
        return Route((HOP,), 1, MODEL, "Q8_0", "rcp-bench", 2, 1.0)

    async def report_work(self, record: object, *, timeout_s: float | None = None) -> None:
        return None


@dataclass(frozen=True)
class _Capability:
    n_ctx_per_session: int = 1 << 20


class _Driver:
    """The route driver's contract without shards: one token per suspension."""

    async def capability(self, address: str, node_id: str | None = None) -> _Capability:
        return _Capability()

    async def run(self, session: Any, request: GenerationRequest, *, history: Sequence[int] = ()) -> AsyncIterator[Any]:
        for index in range(len(history), request.max_tokens):
            await asyncio.sleep(0)
            yield TokenGenerated(OFFSET + ord("a") + index % 26, index, 1.0)


class _Decoder:
    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")()

    def push(self, token_id: int) -> str:
        return self._utf8.decode(bytes([token_id - OFFSET])) if token_id >= OFFSET else ""

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


@dataclass(frozen=True)
class _Codec:
    context_length: int = 1 << 20
    eos_token_ids: frozenset[int] = frozenset({1})
    vocab_size: int = 256 + OFFSET

    def encode(self, text: str, *, add_special: bool) -> list[int]:
        return [byte + OFFSET for byte in text.encode()]

    def encode_chat(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> list[int]:
        return self.encode("".join(m["content"] for m in messages), add_special=False)

    def new_decoder(self) -> _Decoder:
        return _Decoder()

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id - OFFSET]) if token_id >= OFFSET else b""


class _Generator:
    def __init__(self, swarm: SwarmClient) -> None:
        self._swarm = swarm

    def models(self) -> Sequence[ModelCard]:
        return (ModelCard(MODEL, "Q8_0", 1 << 20),)

    async def session_slots(self) -> int | None:
        return None

    async def serve(self, request: GenerationRequest, request_id: RequestId, text: TextPlug, sink: LifeSink) -> None:
        await self._swarm.serve(request, request_id, text, sink)


async def measure(tokens: int, rounds: int) -> dict[str, float]:
    swarm = SwarmClient(_Tracker(), None, _Driver(), SwarmConfig())  # type: ignore[arg-type]
    config = GatewayConfig(max_tokens_limit=1 << 20, progress_every_tokens=64, max_in_flight=4, max_queue=0)
    app = create_app(_Generator(swarm), {MODEL: _Codec()}, config)
    per_token: dict[str, float] = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as http:
        for stream in (True, False):
            body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": tokens}
            seconds = []
            for _ in range(rounds + 1):
                started = time.perf_counter()
                response = await http.post("/v1/chat/completions", json={**body, "stream": stream}, timeout=60)
                seconds.append(time.perf_counter() - started)
                response.raise_for_status()
            per_token["streamed" if stream else "whole"] = statistics.median(seconds[1:]) / tokens * 1e6
    await swarm.drain_reports(1.0)
    return per_token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    for shape, micros in asyncio.run(measure(args.tokens, args.rounds)).items():
        print(f"{shape:>8}: {micros:6.1f} us/token over {args.tokens} tokens (median of {args.rounds})")


if __name__ == "__main__":
    main()
