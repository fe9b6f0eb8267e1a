"""`meshnet up`: a whole swarm on this machine — tracker, N workers, gateway — and a demo.

Each component runs as its own process, exactly as it would on separate machines, talking over
loopback. We wait until every process is ready and the tracker can route the model, stream one
answer with its live telemetry to the terminal, then serve until Ctrl-C and stop everything we
started (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from meshnet.core.config_flags import PROVISIONED_MODEL, cli
from meshnet.core.errors import MeshnetError, Unavailable
from meshnet.core.layers import split_evenly

READY_TIMEOUT_S = 180.0
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class LocalSwarmConfig:
    """``meshnet up``'s configuration; its flags are generated from these fields."""

    data_dir: Path
    """Slice cache, tracker database and the components' logs."""
    model: Path = field(metadata=cli(shown_default=PROVISIONED_MODEL))
    """Source GGUF every worker cuts its slice from."""
    shards: int = 3
    """Workers to start; the model's layers are split evenly between them."""
    gateway_port: int = field(default=8080, metadata=cli("port"))
    """Port of the OpenAI-compatible gateway."""
    prompt: str = "Write a haiku about machines that share their work."
    """The demo prompt streamed once the swarm is routable."""
    max_tokens: int = 64
    """Tokens the demo answer may take."""
    demo_only: bool = False
    """Stop after the demo answer instead of serving."""
    model_name: str | None = None
    """Name the workers and gateway serve the model under; none uses the GGUF's general.name."""
    threads: int = 1
    """llama.cpp threads per worker. Workers share this machine's cores, so one each keeps
    three pipelined shards from competing for two cores."""


class Child:
    """A started component and the ready line it printed."""

    def __init__(self, name: str, command: Sequence[str], ready_prefix: str, log_path: Path) -> None:
        self.name = name
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=_child_env(),
            start_new_session=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        self.ready_line = self._await(ready_prefix, log_path)

    def _pump(self) -> None:
        if self.process.stdout is not None:
            for line in self.process.stdout:
                self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _await(self, prefix: str, log_path: Path) -> str:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                raise Unavailable(f"{self.name} exited during start-up (code {self.process.wait()}); see {log_path}")
            if line.startswith(prefix):
                return line
        raise Unavailable(f"{self.name} did not become ready in {READY_TIMEOUT_S:.0f} s; see {log_path}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # Several llama.cpp processes share these cores: OpenMP threads that spin-wait between
    # graph ops would steal the core the next shard needs. A short spin keeps the op-to-op
    # hand-off fast without burning a core between decode steps (measured).
    env.setdefault("GOMP_SPINCOUNT", "10000")
    return env


def _meshnet(data_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "meshnet.cli", "--data-dir", str(data_dir), *args]


def _stop_on_sigterm() -> None:
    """SIGTERM ends `up` like Ctrl-C does, so the processes it started are stopped too."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def run_local_swarm(config: LocalSwarmConfig) -> int:
    # Here, not at the top: building `meshnet`'s parser imports this module for its config only.
    from meshnet.artifact.describe import describe_model

    _stop_on_sigterm()
    logs = config.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    children: list[Child] = []
    try:
        tracker = Child(
            "tracker",
            _meshnet(config.data_dir, "tracker", "--port", "0", "--heartbeat-interval", "1"),
            "meshnet tracker listening on",
            logs / "tracker.log",
        )
        children.append(tracker)
        tracker_address = tracker.ready_line.rsplit(" ", 1)[-1]
        print(f"tracker   {tracker_address}")
        ranges = split_evenly(describe_model(config.model).n_layers, config.shards)
        for layers in ranges:
            worker = Child(
                f"worker {layers}",
                _meshnet(
                    config.data_dir,
                    "worker",
                    "--model",
                    str(config.model),
                    "--layers",
                    str(layers),
                    "--port",
                    "0",
                    "--tracker",
                    tracker_address,
                    "--threads",
                    str(config.threads),
                    "--metrics-port",
                    "0",
                    *(["--model-name", config.model_name] if config.model_name else []),
                ),
                "meshnet worker ready",
                logs / f"worker-{layers.start}-{layers.stop}.log",
            )
            children.append(worker)
            fields = worker.ready_line.split()
            metrics = next((f.split("=", 1)[1] for f in fields if f.startswith("metrics=")), "")
            print(f"worker    {fields[3]}  layers {layers}  {metrics}")
        gateway = Child(
            "gateway",
            _meshnet(
                config.data_dir,
                "gateway",
                "--tracker",
                tracker_address,
                "--model",
                str(config.model),
                "--port",
                str(config.gateway_port),
                *(["--model-name", config.model_name] if config.model_name else []),
            ),
            "meshnet gateway ready",
            logs / "gateway.log",
        )
        children.append(gateway)
        base_url = gateway.ready_line.split()[3]
        model = gateway.ready_line.split("model=", 1)[1]
        print(f"gateway   {base_url}/v1  (model {model!r}; metrics {base_url}/metrics; logs in {logs})")
        _wait_routable(base_url, model)
        _demo(base_url, model, config)
        if config.demo_only:
            return 0
        print(f"\nServing the OpenAI-compatible API at {base_url}/v1 — press Ctrl-C to stop.")
        while all(child.process.poll() is None for child in children):
            time.sleep(0.5)
        dead = [c.name for c in children if c.process.poll() is not None]
        print(f"stopping: {', '.join(dead)} exited", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping…")
        return 0
    except MeshnetError as error:
        print(f"meshnet up: [{error.code}] {error.message}", file=sys.stderr)
        return 2
    finally:
        for child in reversed(children):
            child.stop()


def _wait_routable(base_url: str, model: str) -> None:
    """Wait until a one-token request succeeds: every worker registered and routable."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    body = {"model": model, "prompt": "ok", "max_tokens": 1, "temperature": 0}
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"{base_url}/v1/completions", json=body, timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise Unavailable("the swarm never became routable; see the logs")


def _demo(base_url: str, model: str, config: LocalSwarmConfig) -> None:
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
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith(": telemetry "):
                event = json.loads(line[len(": telemetry ") :])
                telemetry.append(_describe(event))
                if event.get("kind") != "progress":
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
    if kind == "prefill_completed":
        return f"prefill done: {event.get('prompt_tokens')} tokens in {float(event.get('seconds') or 0):.2f} s"  # type: ignore[arg-type]
    if kind == "completed":
        usage = event.get("usage") or {}
        return f"completed: {json.dumps(usage, separators=(',', ':'))}"
    details = {k: v for k, v in event.items() if k not in ("kind", "request_id", "seq", "at")}
    return f"{kind} {json.dumps(details, separators=(',', ':'))[:120]}"
