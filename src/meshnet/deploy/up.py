"""`meshnet up`: a whole swarm on this machine — tracker, N workers, gateway — and a demo.

Each component runs as its own process, exactly as it would on separate machines, talking over
loopback. The gateway's port is checked before anything starts; then the tracker starts, then
the workers and the gateway together (each needs only the tracker). Once the tracker can route
the model, one answer streams with its live telemetry to the terminal, and `up` serves until
Ctrl-C or SIGTERM, then stops everything it started (SIGTERM, then SIGKILL after a grace).

`up` supervises: a component that crashes is restarted with the same data dir and address (the
tracker keeps its port and database, the gateway its port), each restart printed and counted
in ``DATA_DIR/logs/up-status.json``. Every child holds a lifeline to `up`, so none outlives it,
however `up` ends (SIGKILL included).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx

from meshnet.artifact.cache import SliceCache
from meshnet.core.errors import MeshnetError, Unavailable
from meshnet.core.layers import LayerRange, split_evenly
from meshnet.deploy.config import LocalSwarmConfig
from meshnet.deploy.up_moe import describe_node, run_demo, start_expert_group
from meshnet.gateway.keys import ensure_client_key, read_client_key
from meshnet.process.launcher import LaunchSpec, ReadyLine, meshnet_command
from meshnet.process.ports import ensure_port_free
from meshnet.process.supervisor import Event, RestartPolicy, Supervised, Supervisor
from meshnet.security.identity import Role

READY_TIMEOUT_S = 180.0
STOP_GRACE_S = 10.0
LOOPBACK = "127.0.0.1"
TRACKER_READY = "meshnet tracker listening on "
WORKER_READY = "meshnet worker ready "
GATEWAY_READY = "meshnet gateway ready "
EXPERT_GROUP = "expert-group"
"""The supervisor group of an expert-parallel group's nodes and front: they restart together."""
EXPERT_FRONT = "expert front"


def _identity(config: LocalSwarmConfig, name: str, role: Role) -> tuple[str, ...]:
    """The flags that give one component its swarm identity, minted from this data dir's CA."""
    if config.insecure:
        return ("--insecure",)
    # Imported here: every command's parser imports this module, and only `up` needs the CA code.
    from meshnet.security.swarm_dir import local_identity

    return ("--identity", str(local_identity(config.data_dir, name, role, time.time())))


def _child_env() -> dict[str, str]:
    # Several llama.cpp processes share these cores: OpenMP threads that spin-wait between
    # graph ops would steal the core the next shard needs. A short spin keeps the op-to-op
    # hand-off fast without burning a core between decode steps (measured).
    return {"GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", "10000")}


def _pin_port(spec: LaunchSpec, ready: ReadyLine) -> LaunchSpec:
    """Restart on the port the first start bound: workers and clients know that address."""
    command = list(spec.command)
    port = ready.first.split("://")[-1].rsplit(":", 1)[1]
    command[command.index("--port") + 1] = port
    return replace(spec, command=tuple(command))


def _tracker(config: LocalSwarmConfig, logs: Path) -> Supervised:
    command = meshnet_command(
        config.data_dir,
        "tracker",
        *("--port", "0", "--join-port", "0", "--heartbeat-interval", "1"),
        *(("--insecure",) if config.insecure else ()),
    )
    spec = LaunchSpec("tracker", command, logs / "tracker.log", TRACKER_READY, _child_env())
    return Supervised(spec, pin=_pin_port)


def _worker(config: LocalSwarmConfig, logs: Path, tracker: str, layers: LayerRange) -> Supervised:
    command = meshnet_command(
        config.data_dir,
        "worker",
        *("--model", str(config.model), "--layers", str(layers), "--port", "0", "--tracker", tracker),
        *("--threads", str(config.threads), "--metrics-port", "0"),
        *(["--model-name", config.model_name] if config.model_name else []),
        *(() if config.repack else ("--no-repack",)),
        *_identity(config, f"worker-{layers.start}-{layers.stop}", "worker"),
    )
    log = logs / f"worker-{layers.start}-{layers.stop}.log"
    return Supervised(LaunchSpec(f"worker {layers}", command, log, WORKER_READY, _child_env()))


def _expert_front(config: LocalSwarmConfig, logs: Path, tracker: str, peers: list[str]) -> Supervised:
    """The worker that serves the group's nodes as one full-range shard (``moe/front.py``)."""
    command = meshnet_command(
        config.data_dir,
        "worker",
        *("--model", str(config.model), "--expert-group", ",".join(peers), "--port", "0", "--tracker", tracker),
        *("--metrics-port", "0"),
        *(["--model-name", config.model_name] if config.model_name else []),
        *(() if config.repack else ("--no-repack",)),
        *_identity(config, "expert-front", "worker"),
    )
    spec = LaunchSpec(EXPERT_FRONT, command, logs / "expert-front.log", WORKER_READY, _child_env())
    return Supervised(spec, group=EXPERT_GROUP)


def _gateway(config: LocalSwarmConfig, logs: Path, tracker: str) -> Supervised:
    command = meshnet_command(
        config.data_dir,
        "gateway",
        *("--tracker", tracker, "--model", str(config.model), "--port", str(config.gateway_port)),
        *(["--model-name", config.model_name] if config.model_name else []),
        *(["--max-in-flight", str(config.max_in_flight)] if config.max_in_flight is not None else []),
        *(["--max-queue", str(config.max_queue)] if config.max_queue is not None else []),
        *_identity(config, "gateway", "gateway"),
    )
    return Supervised(LaunchSpec("gateway", command, logs / "gateway.log", GATEWAY_READY, _child_env()), pin=_pin_port)


class _Reporter:
    """Prints each start and restart, and keeps ``logs/up-status.json`` current."""

    def __init__(self, status_path: Path) -> None:
        self.status_path = status_path
        self.supervisor: Supervisor | None = None

    def __call__(self, component: Supervised, event: Event) -> None:
        if event == "exited":
            restarts = self.supervisor is not None and self.supervisor.policy.max_restarts > 0
            then = "; restarting" if restarts else "; not restarted"
            print(f"{component.name} exited (code {component.last_exit}){then}", file=sys.stderr)
        elif event == "restarted":
            print(f"{component.name} restarted at {component.ready.first} (restart {component.restarts})")
        else:
            print(_describe_start(component))
        self._write_status()

    def _write_status(self) -> None:
        components = self.supervisor.components if self.supervisor is not None else []
        status = {
            "updated_at": time.time(),
            "components": [
                {
                    "name": c.name,
                    "pid": c.child.pid if c.child is not None else None,
                    "address": c.child.ready.first if c.child is not None and c.child.ready else None,
                    "restarts": c.restarts,
                    "last_exit": c.last_exit,
                }
                for c in components
            ],
        }
        partial = self.status_path.with_name(f"{self.status_path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(status, indent=1))
        os.replace(partial, self.status_path)


def _describe_start(component: Supervised) -> str:
    ready = component.ready
    if component.name == "tracker":
        return f"tracker   {ready.first}"
    if component.name.startswith("expert-"):
        return describe_node(component, "started")
    if component.name == EXPERT_FRONT:
        return f"front     {ready.first}  the whole model through the expert group  {ready.values.get('metrics', '')}"
    if component.name == "gateway":
        return f"gateway   {ready.first}/v1  (model {ready.value_to_end('model')!r}; metrics {ready.first}/metrics)"
    layers = component.name.removeprefix("worker ")
    return f"worker    {ready.first}  layers {layers}  {ready.values.get('metrics', '')}"


def _stop_on_sigterm() -> None:
    """SIGTERM ends `up` like Ctrl-C does, so the processes it started are stopped too."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _start_swarm(config: LocalSwarmConfig, supervisor: Supervisor, logs: Path) -> tuple[str, str]:
    """Start tracker, then workers and gateway at once; returns (gateway base URL, model name)."""
    ensure_port_free(LOOPBACK, config.gateway_port, "gateway")
    from meshnet.artifact.describe import describe_model  # parsing the GGUF header: only when `up` runs

    ranges = split_evenly(describe_model(config.model).n_layers, config.shards)
    # Hash the source once here rather than in every worker at once (each would hash it).
    SliceCache(config.data_dir / "cache").source_sha256(config.model)
    tracker = _tracker(config, logs)
    supervisor.start([tracker])
    address = tracker.ready.first
    gateway = _gateway(config, logs, address)
    supervisor.start([*(_worker(config, logs, address, layers) for layers in ranges), gateway])
    return gateway.ready.first, gateway.ready.value_to_end("model")


def run_local_swarm(config: LocalSwarmConfig) -> int:
    _stop_on_sigterm()
    logs = config.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # The gateway always requires API keys, --insecure or not: transport security and client
    # authorization are separate decisions, and a local client reads the key from this file.
    key_path = ensure_client_key(config.data_dir)
    auth = {"Authorization": f"Bearer {read_client_key(config.data_dir)}"}
    print(f"api key   {key_path}  (send it as 'Authorization: Bearer KEY')")
    reporter = _Reporter(logs / "up-status.json")
    supervisor = Supervisor(READY_TIMEOUT_S, RestartPolicy(), reporter)
    reporter.supervisor = supervisor
    try:
        if config.expert_parallel > 0:
            served = _start_expert_swarm(config, supervisor, logs)
            if served is None:
                return 0
            base_url, model = served
            _wait_routable(base_url, model, auth)
        else:
            base_url, model = _start_swarm(config, supervisor, logs)
            print(f"logs in {logs}")
            _wait_routable(base_url, model, auth)
            _demo(base_url, model, config, auth)
            if config.demo_only:
                return 0
        print(f"\nServing the OpenAI-compatible API at {base_url}/v1 — press Ctrl-C to stop.")
        supervisor.watch()
    except KeyboardInterrupt:
        print("\nstopping…")
        return 0
    except MeshnetError as error:
        print(f"meshnet up: [{error.code}] {error.message}", file=sys.stderr)
        return 2
    finally:
        supervisor.stop(STOP_GRACE_S)


def _start_expert_swarm(config: LocalSwarmConfig, supervisor: Supervisor, logs: Path) -> tuple[str, str] | None:
    """The tracker, the group's nodes, its demo, then the group's front and gateway; returns
    (gateway base URL, model name), or None after the demo with --demo-only (no tracker then)."""
    ensure_port_free(LOOPBACK, config.gateway_port, "gateway")
    tracker = None
    if not config.demo_only:  # first, so the nodes take its revocation lists and renew through it
        tracker = _tracker(config, logs)
        supervisor.start([tracker])
    address = None if tracker is None else tracker.ready.first
    peers = start_expert_group(config, supervisor, group=EXPERT_GROUP, tracker=address)
    print(f"logs in {logs}")
    run_demo(config, peers)  # straight through the group, before its front drives it
    if tracker is None or address is None:
        return None
    gateway = _gateway(config, logs, address)
    supervisor.start([_expert_front(config, logs, address, peers), gateway])
    return gateway.ready.first, gateway.ready.value_to_end("model")


def _wait_routable(base_url: str, model: str, auth: dict[str, str]) -> None:
    """Wait until a one-token request succeeds: every worker registered and routable."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    body = {"model": model, "prompt": "ok", "max_tokens": 1, "temperature": 0}
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"{base_url}/v1/completions", json=body, headers=auth, timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise Unavailable("the swarm never became routable; see the logs")


def _demo(base_url: str, model: str, config: LocalSwarmConfig, auth: dict[str, str]) -> None:
    print(f"\n> {config.prompt}\n")
    body = {
        "model": model,
        "messages": [{"role": "user", "content": config.prompt}],
        "max_tokens": config.max_tokens,
        "temperature": 0,
        "stream": True,
    }
    telemetry: list[str] = []
    mid_line = False
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, headers=auth, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith(": telemetry "):
                event = json.loads(line[len(": telemetry ") :])
                telemetry.append(_describe(event))
                if event.get("kind") == "prefill_progress":
                    # One line rewritten in place per chunk: a long prompt is visibly moving.
                    print(f"\r  [{telemetry[-1]}]", end="", flush=True)
                    mid_line = True
                elif event.get("kind") != "progress":
                    print(f"{chr(10) if mid_line else ''}  [{telemetry[-1]}]")
                    mid_line = False
            elif line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    text = choice.get("delta", {}).get("content") or ""
                    print(text, end="", flush=True)
                    mid_line = mid_line or bool(text)
    print()


def _describe(event: dict[str, object]) -> str:
    """One short line per telemetry event for the terminal; the full JSON is on the API."""
    kind = str(event.get("kind"))
    if kind == "accepted":
        hops = event.get("hops")
        route = " -> ".join(
            f"{h.get('address')}[{h.get('layers')}]"
            for h in (hops if isinstance(hops, list) else [])
            if isinstance(h, dict)
        )
        return f"accepted: {event.get('model')} {event.get('quantization')}, route {route}"
    if kind == "prefill_progress":
        eta = event.get("eta_seconds")
        what = "replay" if event.get("replay") else "prefill"
        eta_text = f", ETA {float(eta):.1f} s" if isinstance(eta, int | float) else ""
        return f"{what} {event.get('done_tokens')}/{event.get('total_tokens')} tokens{eta_text}"
    if kind == "prefill_completed":
        return f"prefill done: {event.get('prompt_tokens')} tokens in {float(event.get('seconds') or 0):.2f} s"  # type: ignore[arg-type]
    if kind == "completed":
        usage = event.get("usage") or {}
        return f"completed: {json.dumps(usage, separators=(',', ':'))}"
    details = {k: v for k, v in event.items() if k not in ("kind", "request_id", "seq", "at")}
    return f"{kind} {json.dumps(details, separators=(',', ':'))[:120]}"
