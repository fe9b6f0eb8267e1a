"""A whole swarm for end-to-end tests: tracker, real llama.cpp workers and gateway as processes.

``Swarm`` starts ``meshnet tracker``, ``meshnet worker`` and ``meshnet gateway`` from their typed
configs (``deploy.launch``) with the launcher ``meshnet up`` uses (each in its own process group,
on port 0, reading the ready line each prints, holding a lifeline to the test process) with
bounded waits, and ``close`` always stops every process it started: SIGTERM, a short grace, then
SIGKILL to the group. Start-up failures quote the component's log.

The model is a tiny synthetic GGUF that llama.cpp loads in about a second. Its greedy output
varies from token to token (unlike the default synthetic spec, whose greedy output repeats one
token), so "identical output" comparisons in these tests can actually fail.

``Reference`` is what the swarm must equal: the same model as one in-process llama.cpp shard.
``read_sse`` turns a raw gateway stream into timed items (telemetry comments, data chunks,
error events, ``[DONE]``) and lets the caller act on each as it arrives.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from gguf import GGMLQuantizationType

from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.layers import LayerRange
from meshnet.core.sampling_options import TokenLogprobs
from meshnet.core.swarm_options import SecurityOptions
from meshnet.core.tracking import ModelSummary
from meshnet.deploy.launch.commands import (
    INSECURE,
    gateway_command,
    minted_identity,
    tracker_launch,
    worker_command,
)
from meshnet.deploy.launch.ready_lines import GatewayLine, ReadyAnnouncement, TrackerLine, WorkerLine
from meshnet.gateway.config import GatewayConfig, GatewayProcessConfig
from meshnet.gateway.keys import CLIENT_KEY_FILE, ApiKeyStore, new_api_key, store_path
from meshnet.membership.tracker_client import TrackerClient
from meshnet.node.config import LayerChoice, WorkerConfig
from meshnet.process.launcher import ChildProcess, LaunchSpec, stop_all
from meshnet.process.launcher import meshnet_command as meshnet_command  # tests of `meshnet up|lab` use it
from meshnet.route.shard_admin import fetch_metrics
from meshnet.route.shard_stream import ChannelPool
from meshnet.security.identity import Role
from meshnet.security.swarm_dir import load_identity, local_identity
from meshnet.tracker.config import TrackerConfig
from meshnet.wire.tls import LinkSecurity

MODEL_NAME = "tiny"
TINY_SPEC = SyntheticSpec(n_layers=6, weight_type=GGMLQuantizationType.Q8_0, tied_embeddings=False, seed=0)
"""Six layers, untied Q8_0: greedy decoding of PROMPT gives 200 tokens of ~50 distinct ones."""
PROMPT = "the cat is in the house"
"""A chat prompt whose greedy answer runs 200 tokens without EOS on TINY_SPEC."""
LONG_PROMPT = " ".join(["the cat is in the house and the dog is in the garden"] * 4)
"""A chat prompt of about 230 tokens: many prefill chunks when frames are small."""
SAMPLED_SEED = 4
"""With temperature 0.8, this seed also runs 200 tokens on PROMPT without EOS."""
CONTEXT = 512
HEARTBEAT_S = 0.5
MISSED_HEARTBEATS = 3
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 3.0


def write_tiny_model(folder: Path) -> Path:
    return write_synthetic_model(folder / "tiny.gguf", TINY_SPEC)


class Component(ChildProcess):
    """One started process (the launcher's child, in its own process group) and its ready line."""

    @property
    def ready_line(self) -> str:
        return self.ready.text if self.ready is not None else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole group: a component never outlives the test through a child."""
        self.signal_group(sig)

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        return super().stop(grace_s)


def start_component(
    name: str,
    command: Sequence[str],
    log_path: Path,
    line: type[ReadyAnnouncement],
    environment: Mapping[str, str] | None = None,
) -> Component:
    """Start ``command``; it is ready once it prints ``line`` (read it with ``line.read``)."""
    return Component(LaunchSpec(name, tuple(command), log_path, line.PREFIX, dict(environment or {})))


@dataclass
class Worker:
    component: Component
    layers: LayerRange
    address: str = ""
    node_id: str = ""

    @property
    def alive(self) -> bool:
        return self.component.alive


@dataclass
class Swarm:
    """Every process one test module starts; ``close`` stops them all (a context manager)."""

    root: Path
    model: Path
    model_name: str = MODEL_NAME
    heartbeat_s: float = HEARTBEAT_S
    tracker: Component | None = None
    tracker_address: str = ""
    workers: list[Worker] = field(default_factory=list)
    gateways: list[Component] = field(default_factory=list)
    api_key: str = field(default_factory=new_api_key)
    """The client key every gateway of this swarm accepts (written to each one's data dir)."""
    secure: bool = True
    """mTLS on every link with identities minted from ``root``'s swarm CA (as ``meshnet up``)."""
    tracker_db: Path | None = None
    """The tracker's database (default ``root/tracker.sqlite3``): a test may put it on a disk of its own."""
    _count: int = 0
    _security: LinkSecurity | None = None

    @property
    def security(self) -> LinkSecurity | None:
        """A gateway identity for the test's own calls to the tracker and workers (None: plaintext)."""
        if self.secure and self._security is None:
            folder = local_identity(self.root, "test-client", "gateway", time.time())
            self._security = LinkSecurity(load_identity(folder))
        return self._security

    def identity(self, name: str, role: Role) -> SecurityOptions:
        """A component's identity minted from ``root``'s swarm CA, or plaintext."""
        return minted_identity(self.root, name, role) if self.secure else INSECURE

    def __enter__(self) -> Swarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def auth(self) -> dict[str, str]:
        """The ``Authorization`` header of a client holding ``api_key``."""
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def db_path(self) -> Path:
        return self.tracker_db or self.root / "tracker.sqlite3"

    def start_tracker(self, port: int = 0, **fields: Any) -> str:
        """Start (or restart, on the same port and database) the tracker; returns its address.

        ``fields`` set ``TrackerConfig`` fields over the harness's own (``work_grace_s``)."""
        own: dict[str, Any] = {
            "heartbeat_interval_s": self.heartbeat_s,
            "missed_heartbeats": MISSED_HEARTBEATS,
            "shutdown_grace_s": 0.5,
            "join_port": 0,
            "insecure": not self.secure,
        }
        config = TrackerConfig(port=port, db_path=self.db_path, **{**own, **fields})
        launch = tracker_launch(config, self.root)
        component = start_component("tracker", launch.argv, self._log("tracker"), TrackerLine, launch.environment)
        self.tracker = component
        self.tracker_address = TrackerLine.read(component.await_ready(time.monotonic() + START_TIMEOUT_S)).address
        return self.tracker_address

    @property
    def tracker_port(self) -> int:
        return int(self.tracker_address.rsplit(":", 1)[1])

    def restart_tracker(self, **fields: Any) -> str:
        """Stop the tracker and start it again on its port and database (``fields`` as
        ``start_tracker``'s); the live workers re-register with it by their heartbeats."""
        if self.tracker is not None:
            self.tracker.stop()
        return self.start_tracker(self.tracker_port, **fields)

    def start_workers(
        self,
        *ranges: str,
        program: Sequence[str] | None = None,
        timeout_s: float = START_TIMEOUT_S,
        **fields: Any,
    ) -> list[Worker]:
        """Start one worker per ``A:B`` range at once; return them once each printed ready.

        ``program`` replaces ``python -m meshnet`` (a test's altered worker, or another build's
        meshnet); ``fields`` set ``WorkerConfig`` fields over the harness's own
        (``n_ctx_per_session``, ``port``, ``device``); ``timeout_s`` bounds the wait for ready.
        """
        started = []
        for text in ranges:
            layers = LayerRange.parse(text)
            name = f"worker-{self._next()}-{layers.start}-{layers.stop}"
            data_dir = self.root / name
            data_dir.mkdir(parents=True, exist_ok=True)
            own: dict[str, Any] = {"port": 0, "threads": 1, "n_ctx_per_session": CONTEXT, "drain_grace": 1.0}
            config = WorkerConfig(
                model=self.model,
                model_name=self.model_name,
                layer_choice=LayerChoice(layers),
                tracker=self.tracker_address,
                data_dir=data_dir,
                **{**own, **fields},
            )
            command = worker_command(config, self.identity(name, "worker"))
            if program is not None:
                command = (*program, *command[3:])  # the launcher's command starts: python -m meshnet
            component = start_component(name, command, self._log(name), WorkerLine)
            worker = Worker(component, layers)
            self.workers.append(worker)
            started.append(worker)
        deadline = time.monotonic() + timeout_s
        for worker in started:
            ready = WorkerLine.read(worker.component.await_ready(deadline))
            worker.address, worker.node_id = ready.address, ready.node_id
        return started

    def start_gateway(self, *, data_dir: Path | None = None, http: GatewayConfig | None = None, **fields: Any) -> str:
        """Start a gateway; returns its base URL (``http://host:port``).

        ``http`` and ``fields`` set its config (``GatewayProcessConfig``) beyond the swarm's own
        tracker, model and a free port. Each gateway gets its own data directory (its outbox of
        work records is exclusive) unless ``data_dir`` names one, e.g. to restart a gateway over
        the outbox it left. The audit is off unless ``fields`` set ``audit_fraction``: its
        background replays would hold sessions that tests counting them do not expect.
        """
        name = f"gateway-{self._next()}"
        home = data_dir or self.root / name
        home.mkdir(parents=True, exist_ok=True)
        give_api_key(home, self.api_key)
        config = GatewayProcessConfig(
            tracker=self.tracker_address,
            model=self.model,
            http=replace(http or GatewayConfig(), port=0),
            data_dir=home,
            model_name=self.model_name,
            **{"audit_fraction": 0.0, **fields},
        )
        command = gateway_command(config, self.identity(name, "gateway"))
        component = start_component(name, command, self._log(name), GatewayLine)
        self.gateways.append(component)
        return GatewayLine.read(component.await_ready(time.monotonic() + START_TIMEOUT_S)).url

    def live_workers(self, layers: str | None = None) -> list[Worker]:
        wanted = None if layers is None else LayerRange.parse(layers)
        return [w for w in self.workers if w.alive and (wanted is None or w.layers == wanted)]

    def worker_at(self, address: str) -> Worker:
        """The live worker at ``address`` (a dead one's port may have been handed out again)."""
        return next(w for w in self.workers if w.address == address and w.alive)

    def wait_routable(self, nodes: int, timeout_s: float = 15.0, *, routable: bool = True) -> ModelSummary:
        """Wait until the tracker lists the model (routable, unless told) over exactly ``nodes`` nodes.

        The tracker counts a killed worker until it misses enough heartbeats, so a count alone
        can be met by a dead node standing in for a live one still registering: wait for the
        dead to leave first (``settle``).
        """
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            try:
                models = asyncio.run(list_models(self.tracker_address, self.security))
                last = models
                summary = next((m for m in models if m.name == self.model_name), None)
                if summary is not None and (summary.routable or not routable) and summary.nodes == nodes:
                    return summary
            except Exception as error:  # the tracker may be restarting; the deadline bounds this
                last = error
            time.sleep(0.1)
        raise AssertionError(f"tracker never listed {self.model_name} routable over {nodes} nodes: {last!r}")

    def settle(self, timeout_s: float = 15.0) -> None:
        """Wait until the tracker counts exactly the live workers: the killed ones have expired."""
        self.wait_routable(len(self.live_workers()), timeout_s, routable=False)

    def close(self) -> None:
        stop_all([*self.gateways, *(w.component for w in self.workers)], STOP_GRACE_S)
        if self.tracker is not None:
            self.tracker.stop()

    def _next(self) -> int:
        self._count += 1
        return self._count

    def _log(self, name: str) -> Path:
        return self.root / f"{name}.log"


def give_api_key(data_dir: Path, key: str) -> None:
    """Make ``key`` a valid client key of a gateway over ``data_dir`` (store and ``api-key`` file)."""
    store = ApiKeyStore(store_path(data_dir))
    if store.verify(key) is None:
        store.add("harness", key)
    (data_dir / CLIENT_KEY_FILE).write_text(key + "\n")
    (data_dir / CLIENT_KEY_FILE).chmod(0o600)


async def list_models(tracker_address: str, security: LinkSecurity | None = None) -> tuple[ModelSummary, ...]:
    async with TrackerClient(tracker_address, timeout_s=1.0, security=security) as client:
        return await client.list_models()


async def route_addresses(tracker_address: str, security: LinkSecurity | None = None) -> list[str]:
    """The addresses of the route the tracker would give the (only) model now: a probe without a
    session, which holds no room on the nodes."""
    async with TrackerClient(tracker_address, timeout_s=1.0, security=security) as client:
        (model, *_) = await client.list_models()
        route = await client.choose_route(model.name)
        return [hop.address for hop in route.hops]


async def _active_sessions(addresses: Sequence[str], security: LinkSecurity | None) -> list[int]:
    pool = ChannelPool(4 * 1024 * 1024, security)
    try:
        answers = await asyncio.gather(*(fetch_metrics(pool, address, timeout_s=1.0) for address in addresses))
        return [int(values["active_sessions"]) for values in answers]
    finally:
        await pool.close()


def active_sessions(addresses: Sequence[str], security: LinkSecurity | None = None) -> list[int]:
    return asyncio.run(_active_sessions(addresses, security))


def wait_sessions_freed(addresses: Sequence[str], within_s: float, security: LinkSecurity | None = None) -> float:
    """Seconds until every worker reports 0 active sessions; AssertionError after ``within_s``."""
    started = time.monotonic()
    while True:
        active = active_sessions(addresses, security)
        elapsed = time.monotonic() - started
        if not any(active):
            return elapsed
        if elapsed > within_s:
            raise AssertionError(f"sessions still open after {within_s} s: {active} on {list(addresses)}")
        time.sleep(0.02)


def stop_string_of(text: str, after: int = 8) -> tuple[str, int]:
    """A two-character stop string of ``text`` and where it starts: printable ASCII, first found
    at its own place (at or past ``after``). On the tiny model each ASCII character is one token,
    so the stop string straddles a token boundary."""
    for start in range(after, len(text) - 1):
        stop = text[start : start + 2]
        if stop.isascii() and stop.isprintable() and text.find(stop) == start:
            return stop, start
    raise AssertionError(f"no usable stop string in {text!r}")


def query_db(db_path: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` read straight from the tracker's SQLite file (read-only, beside the tracker)."""
    connection = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5.0)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


# -- the in-process reference --------------------------------------------------------------------


class Reference:
    """The whole model in one in-process llama.cpp shard, with the gateway's own tokenizer."""

    def __init__(self, model: Path, cache_dir: Path, context: int = CONTEXT) -> None:
        from meshnet.artifact.cache import SliceCache
        from meshnet.engine.llama_config import LlamaConfig
        from meshnet.engine.shards import open_local_route
        from meshnet.engine.tokenizer import Tokenizer

        description = describe_model(model)
        self.tokenizer = Tokenizer(description)
        from meshnet.node.config import WorkerConfig

        # The workers' chunking (their default): the arithmetic of a prompt's rows follows it.
        chunk = WorkerConfig.prefill_chunk
        config = LlamaConfig(max_batch_tokens=chunk, n_threads=1, max_slots=1, n_ctx_per_slot=context)
        self.route = open_local_route(description, 1, SliceCache(cache_dir), config)

    def chat_tokens(self, content: str) -> tuple[int, ...]:
        """What the gateway's chat endpoint sends the route for one user message."""
        return tuple(self.tokenizer.encode_chat([{"role": "user", "content": content}]))

    def text_tokens(self, prompt: str) -> tuple[int, ...]:
        """What the completions endpoint sends for a string prompt."""
        return tuple(self.tokenizer.encode(prompt, add_special=True))

    def generate(self, prompt: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None) -> list[int]:
        return [token for token, _ in self.choices(prompt, max_tokens, sampling)]

    def choices(
        self, prompt: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None
    ) -> list[tuple[int, TokenLogprobs | None]]:
        """Each token with its logprobs, chosen by the tail's own sampler (penalties, logit_bias)."""
        eos = self.tokenizer.eos_token_ids
        request = GenerationRequest(tuple(prompt), max_tokens, sampling or SamplingParams(), eos)
        return list(self.route.choices(request))

    def text(self, tokens: Sequence[int]) -> str:
        """The client-visible text: EOS is not text, and generation ends there."""
        kept = []
        for token in tokens:
            if token in self.tokenizer.eos_token_ids:
                break
            kept.append(token)
        return self.tokenizer.decode(kept)

    def close(self) -> None:
        self.route.close()
        self.tokenizer.close()


# -- reading the gateway's raw SSE ---------------------------------------------------------------


@dataclass(frozen=True)
class SseItem:
    at: float
    """time.monotonic() when the line was read."""
    kind: str
    """``telemetry``, ``chunk``, ``error`` or ``done``."""
    payload: Any = None

    @property
    def text(self) -> str:
        if self.kind != "chunk":
            return ""
        choice = (self.payload.get("choices") or [{}])[0]
        if "delta" in choice:
            return str(choice["delta"].get("content") or "")
        return str(choice.get("text") or "")


@dataclass
class SseResult:
    status: int
    headers: httpx.Headers
    items: list[SseItem]

    def telemetry(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [i.payload for i in self.items if i.kind == "telemetry" and (kind is None or i.payload["kind"] == kind)]

    @property
    def text(self) -> str:
        return "".join(item.text for item in self.items)

    @property
    def request_id(self) -> str:
        return str(self.headers.get("x-request-id"))


def parse_sse_line(line: str, at: float) -> SseItem | None:
    if line.startswith(": telemetry "):
        return SseItem(at, "telemetry", json.loads(line[len(": telemetry ") :]))
    if line == "data: [DONE]":
        return SseItem(at, "done")
    if line.startswith("data: "):
        payload = json.loads(line[len("data: ") :])
        return SseItem(at, "error" if "error" in payload else "chunk", payload)
    return None


def read_sse(
    base_url: str,
    path: str,
    body: dict[str, Any],
    *,
    on_item: Callable[[SseItem, list[SseItem]], None] | None = None,
    timeout_s: float = 60.0,
    headers: dict[str, str] | None = None,
) -> SseResult:
    """POST ``body`` and read the SSE reply to its end, calling ``on_item(item, so_far)`` per item."""
    items: list[SseItem] = []
    with httpx.stream("POST", base_url + path, json=body, headers=headers, timeout=timeout_s) as response:
        if response.status_code != 200:
            response.read()
            failure = SseItem(time.monotonic(), "http", response.json())
            return SseResult(response.status_code, response.headers, [failure])
        for line in response.iter_lines():
            item = parse_sse_line(line, time.monotonic())
            if item is None:
                continue
            items.append(item)
            if on_item is not None:
                on_item(item, items)
        return SseResult(response.status_code, response.headers, items)


def chat_body(
    max_tokens: int, *, temperature: float = 0.0, seed: int | None = None, stream: bool = True, content: str = PROMPT
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": stream,
    }
    if seed is not None:
        body["seed"] = seed
    return body


class MiddleKiller:
    """Reads the stream; after ``after`` text chunks, SIGKILLs the middle hop of the accepted route."""

    def __init__(self, swarm: Swarm, after: int) -> None:
        self.swarm = swarm
        self.after = after
        self.hops: list[dict[str, Any]] = []
        self.killed_at: float | None = None
        self.killed_address = ""
        self._chunks = 0

    def __call__(self, item: SseItem, items: list[SseItem]) -> None:
        if item.kind == "telemetry" and item.payload["kind"] == "accepted" and not self.hops:
            self.hops = item.payload["hops"]
        if item.kind == "chunk" and item.text:
            self._chunks += 1
            if self._chunks == self.after and self.killed_at is None:
                self.killed_address = self.hops[1]["address"]
                self.swarm.worker_at(self.killed_address).component.kill(signal.SIGKILL)
                self.killed_at = time.monotonic()

    def after_kill(self, result: SseResult) -> list[SseItem]:
        assert self.killed_at is not None, "the stream ended before the kill"
        return [item for item in result.items if item.at >= self.killed_at]
