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
from meshnet.core.errors import InvalidArgument, MeshnetError, Unavailable
from meshnet.core.layers import LayerRange, split_evenly
from meshnet.core.limits import up_context
from meshnet.core.swarm_options import SecurityOptions
from meshnet.deploy.config import LocalSwarmConfig
from meshnet.deploy.launch.commands import (
    INSECURE,
    gateway_command,
    minted_identity,
    tracker_launch,
    worker_command,
)
from meshnet.deploy.launch.ready_lines import GatewayLine, TrackerLine, UpLine, WorkerLine
from meshnet.deploy.up_demo import stream_demo
from meshnet.deploy.up_moe import describe_node, run_demo, start_expert_group
from meshnet.gateway.config import GatewayConfig, GatewayProcessConfig
from meshnet.gateway.keys import ensure_client_key, read_client_key
from meshnet.moe.shape import read_moe_shape
from meshnet.node.config import LayerChoice, WorkerConfig
from meshnet.process.launcher import LaunchSpec, ReadyLine
from meshnet.process.ports import ensure_port_free
from meshnet.process.supervisor import Event, RestartPolicy, Supervised, Supervisor
from meshnet.security.identity import Role
from meshnet.tracker.config import TrackerConfig

READY_TIMEOUT_S = 180.0
STOP_GRACE_S = 10.0
LOOPBACK = "127.0.0.1"
EXPERT_GROUP = "expert-group"
"""The supervisor group of an expert-parallel group's nodes and front: they restart together."""
EXPERT_FRONT = "expert front"


def _security(config: LocalSwarmConfig, name: str, role: Role) -> SecurityOptions:
    """One component's swarm identity, minted from this data dir's CA (or plaintext)."""
    return INSECURE if config.insecure else minted_identity(config.data_dir, name, role)


def _child_env() -> dict[str, str]:
    # Several llama.cpp processes share these cores: OpenMP threads that spin-wait between
    # graph ops would steal the core the next shard needs. A short spin keeps the op-to-op
    # hand-off fast without burning a core between decode steps (measured).
    return {"GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", "10000")}


def status_page_url(base_url: str) -> str:
    """The operator's status page: the gateway's ``/status``, without the key (the page asks)."""
    return f"{base_url.rstrip('/')}/status"


def _bound_port(ready: ReadyLine) -> int:
    return int(ready.first.split("://")[-1].rsplit(":", 1)[1])


def _tracker(config: LocalSwarmConfig, logs: Path) -> Supervised:
    tracker = TrackerConfig(port=0, join_port=0, heartbeat_interval_s=1.0, insecure=config.insecure, metrics_port=0)

    def spec(tracker: TrackerConfig) -> LaunchSpec:
        launch = tracker_launch(tracker, config.data_dir)
        environment = {**_child_env(), **launch.environment}
        return LaunchSpec("tracker", launch.argv, logs / "tracker.log", TrackerLine.PREFIX, environment)

    def pin(_: LaunchSpec, ready: ReadyLine) -> LaunchSpec:
        # Restart on the port the first start bound: workers and clients know that address.
        return spec(replace(tracker, port=_bound_port(ready)))

    return Supervised(spec(tracker), pin=pin)


def _worker(config: LocalSwarmConfig, logs: Path, tracker: str, layers: LayerRange) -> Supervised:
    name = f"worker-{layers.start}-{layers.stop}"
    worker = WorkerConfig(
        model=config.model,
        layer_choice=LayerChoice(layers),
        data_dir=config.data_dir,
        model_name=config.model_name,
        port=0,
        tracker=tracker,
        threads=config.threads,
        metrics_port=0,
        repack=config.repack,
        prefix_cache_mb=config.prefix_cache_mb,
        snapshot_every=config.snapshot_every,
        snapshot_disk_mb=config.snapshot_disk_mb,
        prefill_chunk=config.prefill_chunk,
        kv_type=config.kv_type,
        n_ctx_per_session=WorkerConfig.n_ctx_per_session if config.context is None else config.context,
    )
    command = worker_command(worker, _security(config, name, "worker"))
    return Supervised(LaunchSpec(f"worker {layers}", command, logs / f"{name}.log", WorkerLine.PREFIX, _child_env()))


def _expert_front(config: LocalSwarmConfig, logs: Path, tracker: str, peers: list[str]) -> Supervised:
    """The worker that serves the group's nodes as one full-range shard (``moe/front.py``)."""
    front = WorkerConfig(
        model=config.model,
        layer_choice=LayerChoice(LayerRange(0, read_moe_shape(config.model).n_layers)),
        data_dir=config.data_dir,
        model_name=config.model_name,
        port=0,
        tracker=tracker,
        metrics_port=0,
        repack=config.repack,
        expert_group=tuple(peers),
    )
    command = worker_command(front, _security(config, "expert-front", "worker"))
    spec = LaunchSpec(EXPERT_FRONT, command, logs / "expert-front.log", WorkerLine.PREFIX, _child_env())
    return Supervised(spec, group=EXPERT_GROUP)


def _gateway(config: LocalSwarmConfig, logs: Path, tracker: str) -> Supervised:
    http = GatewayConfig(port=config.gateway_port, max_in_flight=config.max_in_flight, max_queue=config.max_queue)
    gateway = GatewayProcessConfig(
        tracker=tracker,
        model=config.model,
        http=http,
        data_dir=config.data_dir,
        model_name=config.model_name,
        chat_template=config.chat_template,
    )
    security = _security(config, "gateway", "gateway")

    def spec(gateway: GatewayProcessConfig) -> LaunchSpec:
        command = gateway_command(gateway, security)
        return LaunchSpec("gateway", command, logs / "gateway.log", GatewayLine.PREFIX, _child_env())

    def pin(_: LaunchSpec, ready: ReadyLine) -> LaunchSpec:
        return spec(replace(gateway, http=replace(http, port=_bound_port(ready))))

    return Supervised(spec(gateway), pin=pin)


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
                    "metrics": _metrics_url(c) if c.child is not None and c.child.ready else None,
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
        return f"tracker   {ready.first}  {_metrics_url(component) or ''}"
    if component.name.startswith("expert-"):
        return describe_node(component, "started")
    if component.name == "gateway":
        gateway = GatewayLine.read(ready)
        return f"gateway   {gateway.url}/v1  (model {gateway.model!r}; metrics {gateway.url}/metrics)"
    worker = WorkerLine.read(ready)
    if component.name == EXPERT_FRONT:
        return f"front     {worker.address}  the whole model through the expert group  {worker.metrics or ''}"
    layers = component.name.removeprefix("worker ")
    return f"worker    {worker.address}  layers {layers}  {worker.metrics or ''}"


def _metrics_url(component: Supervised) -> str | None:
    """Where a started component serves Prometheus ``/metrics`` (its ready line says), if it does."""
    ready = component.ready
    if component.name == "tracker":
        return TrackerLine.read(ready).metrics
    if component.name == "gateway":
        return f"{GatewayLine.read(ready).url}/metrics"
    if component.name.startswith("expert-"):
        return None  # an expert node serves no /metrics of its own; the group's front does
    return WorkerLine.read(ready).metrics


def _stop_on_sigterm() -> None:
    """SIGTERM ends `up` like Ctrl-C does, so the processes it started are stopped too."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _start_swarm(config: LocalSwarmConfig, supervisor: Supervisor, logs: Path) -> tuple[str, str]:
    """Start tracker, then workers and gateway at once; returns (gateway base URL, model name)."""
    ensure_port_free(LOOPBACK, config.gateway_port, "gateway")
    from meshnet.artifact.describe import describe_model  # parsing the GGUF header: only when `up` runs

    description = describe_model(config.model)
    ranges = split_evenly(description.n_layers, config.shards)
    # Every worker holds the same context: --context, else the model's trained length up to 8,192.
    config = replace(config, context=up_context(description.context_length, config.context))
    # Hash the source once here rather than in every worker at once (each would hash it).
    SliceCache(config.data_dir / "cache").source_sha256(config.model)
    tracker = _tracker(config, logs)
    supervisor.start([tracker])
    address = TrackerLine.read(tracker.ready).address
    gateway = _gateway(config, logs, address)
    supervisor.start([*(_worker(config, logs, address, layers) for layers in ranges), gateway])
    served = GatewayLine.read(gateway.ready)
    return served.url, served.model


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
            _serves_chat(config)  # the group's demo is a completion too when there is no template
            served = _start_expert_swarm(config, supervisor, logs)
            if served is None:
                return 0
            base_url, model = served
            _wait_routable(base_url, model, auth)
        else:
            chat = _serves_chat(config)
            base_url, model = _start_swarm(config, supervisor, logs)
            print(f"logs in {logs}")
            _wait_routable(base_url, model, auth)
            stream_demo(base_url, model, config, auth, chat=chat)
            if config.demo_only:
                return 0
        print(f"status    {status_page_url(base_url)}  (the page asks for the API key)")
        print(f"\n{UpLine(base_url + '/v1')} — press Ctrl-C to stop.", flush=True)
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
    address = None if tracker is None else TrackerLine.read(tracker.ready).address
    peers = start_expert_group(config, supervisor, group=EXPERT_GROUP, tracker=address)
    print(f"logs in {logs}")
    run_demo(config, peers)  # straight through the group, before its front drives it
    if tracker is None or address is None:
        return None
    gateway = _gateway(config, logs, address)
    supervisor.start([_expert_front(config, logs, address, peers), gateway])
    served = GatewayLine.read(gateway.ready)
    return served.url, served.model


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


def _serves_chat(config: LocalSwarmConfig) -> bool:
    """Whether the gateway will serve chat; a base model's refusal is said now, with its fix."""
    from meshnet.artifact.describe import describe_model  # parsing the GGUF header: only when `up` runs

    if config.chat_template is not None:
        if not config.chat_template.is_file():
            raise InvalidArgument(f"--chat-template {config.chat_template}: no such file")
        return True
    if describe_model(config.model).chat_template is not None:
        return True
    print(
        f"chat      off: {config.model.name} has no chat template (a base model), so /v1/chat/completions "
        "answers 400 and /v1/completions serves; give one with --chat-template FILE"
    )
    return False
