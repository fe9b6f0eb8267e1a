"""The ``meshnet`` command: subcommands build their component's config and hand over.

This is the one place that prints for humans; everything below logs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from meshnet.core.errors import MeshnetError
from meshnet.core.layers import LayerRange
from meshnet.process.lifeline import watch_lifeline

if TYPE_CHECKING:
    from meshnet.engine.llama_backend import LlamaConfig

Handler = Callable[[argparse.Namespace], int]


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "meshnet"


def _progress_printer() -> Callable[[str, int, int], None]:
    last = [0.0]

    def show(stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] > 0.2:
            last[0] = now
            percent = 100.0 * done / max(total, 1)
            end = "\n" if done == total else ""
            print(f"\r{stage:8s} {done / 1e6:8.1f} / {total / 1e6:.1f} MB  {percent:5.1f}%", end=end, flush=True)

    return show


def cmd_provision(args: argparse.Namespace) -> int:
    from meshnet.artifact.provision import DEFAULT_MODEL, provision_model

    path = provision_model(args.data_dir / "models", progress=_progress_printer())
    print(f"{DEFAULT_MODEL.name}: {path} (sha256 {DEFAULT_MODEL.sha256[:16]}… verified)")
    return 0


def resolve_model(args: argparse.Namespace) -> Path:
    from meshnet.artifact.provision import model_path

    if args.model is not None:
        return Path(args.model)
    path = model_path(args.data_dir / "models")
    if not path.exists():
        raise MeshnetError(f"the default model is not provisioned at {path}: run `meshnet provision`")
    return path


def cmd_slice(args: argparse.Namespace) -> int:
    from meshnet.artifact.gguf_file import parse_gguf
    from meshnet.artifact.hashing import file_sha256
    from meshnet.artifact.slicing import model_dimensions, slice_role, write_embedding_table, write_slice

    layers = LayerRange.parse(args.layers)
    source_hash = file_sha256(args.source)
    provenance = write_slice(args.source, layers, args.output, source_sha256=source_hash)
    print(f"{args.output}: {provenance.role} slice of layers {layers}, {args.output.stat().st_size / 1e6:.1f} MB")
    n_layers = model_dimensions(parse_gguf(args.source))[1]
    if slice_role(layers, n_layers) == "head":
        table = args.output.with_name(args.output.stem + ".embeddings.gguf")
        write_embedding_table(args.source, table, source_sha256=source_hash)
        print(f"{table}: quantized token table for the head's lookups, {table.stat().st_size / 1e6:.1f} MB")
    return 0


def _llama_config(args: argparse.Namespace) -> LlamaConfig:
    from meshnet.engine.llama_backend import LlamaConfig

    return LlamaConfig(
        n_threads=args.threads,
        max_slots=args.max_sessions,
        n_ctx_per_slot=args.context,
        max_batch_tokens=args.prefill_chunk,
    )


def cmd_certify(args: argparse.Namespace) -> int:
    from meshnet.engine.certification import certify_llama_engine

    report = certify_llama_engine()
    print(f"llama-cpp-python {report.backend_version}: certified")
    for check in report.checks:
        print(f"  ok  {check}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from meshnet.artifact.cache import SliceCache
    from meshnet.core.generation import GenerationRequest, SamplingParams
    from meshnet.engine.certification import certify_llama_engine
    from meshnet.engine.shards import open_local_route
    from meshnet.engine.tokenizer import Tokenizer

    certify_llama_engine()
    source = resolve_model(args)
    tokenizer = Tokenizer(source)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
    tokens = tokenizer.encode(prompt, add_special=False)
    route = open_local_route(source, args.shards, SliceCache(args.data_dir / "cache"), _llama_config(args))
    ranges = ", ".join(str(b.shape.layers) for b in route.backends)
    print(f"[{args.shards} in-process shard(s): {ranges}; prompt {len(tokens)} tokens]", file=sys.stderr)
    request = GenerationRequest(
        tuple(tokens),
        args.max_tokens,
        SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed),
        tokenizer.eos_token_ids,
    )
    decoder = tokenizer.new_decoder()
    started, count = time.perf_counter(), 0
    for token in route.generate(request):
        count += 1
        if token not in tokenizer.eos_token_ids:
            print(decoder.push(token), end="", flush=True)
    print(decoder.flush())
    elapsed = time.perf_counter() - started
    print(f"[{count} tokens in {elapsed:.2f} s, {count / elapsed:.1f} tok/s]", file=sys.stderr)
    route.close()
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    import asyncio

    from meshnet.worker.config import FakeModel, WorkerConfig
    from meshnet.worker.server import WorkerReady, serve_worker

    fake = None
    if args.fake_layers is not None:
        fake = FakeModel(n_layers=args.fake_layers, step_delay=args.fake_step_delay)
    config = WorkerConfig(
        model=None if fake else resolve_model(args),
        layers=LayerRange.parse(args.layers),
        data_dir=args.data_dir,
        fake=fake,
        model_name=args.model_name,
        host=args.host,
        port=args.port,
        advertise=args.advertise,
        tracker=args.tracker,
        threads=args.threads,
        max_sessions=args.max_sessions,
        n_ctx_per_session=args.context,
        prefill_chunk=args.prefill_chunk,
        drain_grace=args.drain_grace,
        metrics_port=args.metrics_port,
        memory_budget_mb=args.memory_budget_mb,
    )

    def ready(info: WorkerReady) -> None:
        # Tests and `meshnet up` read this line to learn the bound address.
        metrics = f" metrics=http://{info.metrics_address}/metrics" if info.metrics_address else ""
        print(f"meshnet worker ready {info.address} node={info.node_id} recipe={info.fingerprint}{metrics}", flush=True)

    asyncio.run(serve_worker(config, on_ready=ready))
    return 0


def cmd_tracker(args: argparse.Namespace) -> int:
    from meshnet.tracker.server import run_tracker

    return run_tracker(args)


def cmd_gateway(args: argparse.Namespace) -> int:
    import asyncio

    from meshnet.gateway.config import GatewayConfig
    from meshnet.gateway.main import GatewayProcessConfig, run_gateway

    config = GatewayProcessConfig(
        tracker=args.tracker,
        model=resolve_model(args),
        model_name=args.model_name,
        http=GatewayConfig(host=args.host, port=args.port, max_in_flight=args.max_in_flight),
    )

    def ready(address: str, model: str) -> None:
        print(f"meshnet gateway ready http://{address} model={model}", flush=True)

    asyncio.run(run_gateway(config, on_ready=ready))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from meshnet.artifact.provision import DEFAULT_MODEL
    from meshnet.local_swarm import LocalSwarmConfig, run_local_swarm

    config = LocalSwarmConfig(
        data_dir=args.data_dir,
        model=resolve_model(args),
        model_name=None if args.model else DEFAULT_MODEL.name,
        shards=args.shards,
        gateway_port=args.port,
        prompt=args.prompt,
        max_tokens=args.max_tokens,
        demo_only=args.demo_only,
        threads=args.threads,
    )
    return run_local_swarm(config)


def cmd_bench(args: argparse.Namespace) -> int:
    import shlex

    from meshnet.bench.command import bench_command

    return bench_command(
        model=resolve_model(args),
        data_dir=args.data_dir,
        out=args.out,
        report_dir=args.report,
        quick=args.quick,
        threads=args.threads,
        lanes=args.lanes,
        budget_s=args.budget,
        command=shlex.join(["meshnet", *sys.argv[1:]]),
        say=print,
        note=lambda line: print(line, file=sys.stderr, flush=True),
    )


def cmd_gate(args: argparse.Namespace) -> int:
    from meshnet.bench.command import gate_command

    return gate_command(args.results, args.contract, say=print, note=lambda line: print(line, file=sys.stderr))


def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads per shard")
    parser.add_argument("--max-sessions", type=int, default=8, help="sessions with KV at once per shard")
    parser.add_argument("--context", type=int, default=2048, help="positions per session")
    parser.add_argument("--prefill-chunk", type=int, default=256, help="tokens per prefill call (part of the recipe)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meshnet", description="Serve one GGUF model across several machines.")
    parser.add_argument("--data-dir", type=Path, default=default_data_dir(), help="models, slice cache, databases")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("provision", help="fetch and verify the default model (SmolLM2-135M-Instruct Q4_1)")

    slicer = commands.add_parser("slice", help="write the GGUF slice for a layer range")
    slicer.add_argument("source", type=Path)
    slicer.add_argument("--layers", required=True, help="A:B, half-open (B exclusive)")
    slicer.add_argument("-o", "--output", type=Path, required=True)

    commands.add_parser("certify", help="check this llama.cpp build runs split models bit-identically")

    generate = commands.add_parser("generate", help="run a prompt through an in-process N-shard route")
    generate.add_argument("prompt")
    generate.add_argument("--model", type=Path, default=None, help="source GGUF (default: the provisioned model)")
    generate.add_argument("--shards", type=int, default=3)
    generate.add_argument("--max-tokens", type=int, default=128)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--top-p", type=float, default=1.0)
    generate.add_argument("--top-k", type=int, default=0)
    generate.add_argument("--seed", type=int, default=0)
    _engine_arguments(generate)

    worker = commands.add_parser("worker", help="serve one layer range of a model over gRPC")
    worker.add_argument("--model", type=Path, default=None, help="source GGUF (default: the provisioned model)")
    worker.add_argument("--model-name", default=None, help="name served to clients (default: from the GGUF)")
    worker.add_argument("--layers", required=True, help="A:B, half-open (B exclusive)")
    worker.add_argument("--host", default="127.0.0.1", help="bind address (loopback unless told otherwise)")
    worker.add_argument("--port", type=int, default=0, help="0 picks a free port")
    worker.add_argument("--advertise", default=None, help="address peers use (default host:port)")
    worker.add_argument("--tracker", default=None, help="tracker address to register with")
    worker.add_argument("--drain-grace", type=float, default=20.0, help="seconds in-flight sessions get on SIGTERM")
    worker.add_argument(
        "--memory-budget-mb", type=float, default=None, help="cap weights + KV + scratch; --max-sessions is cut to fit"
    )
    worker.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics here (0 picks)")
    worker.add_argument("--fake-layers", type=int, default=None, help="serve a fake model of N layers (tests)")
    worker.add_argument("--fake-step-delay", type=float, default=0.0, help="seconds each fake batch sleeps (tests)")
    _engine_arguments(worker)

    from meshnet.tracker.server import add_tracker_arguments

    tracker = commands.add_parser("tracker", help="register shards, choose routes, keep work records")
    add_tracker_arguments(tracker)

    gateway = commands.add_parser("gateway", help="OpenAI-compatible HTTP API over the swarm")
    gateway.add_argument("--tracker", required=True, help="tracker address")
    gateway.add_argument("--model", type=Path, default=None, help="GGUF to read the tokenizer from")
    gateway.add_argument("--model-name", default=None)
    gateway.add_argument("--host", default="127.0.0.1")
    gateway.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    gateway.add_argument("--max-in-flight", type=int, default=8, help="requests served at once; more get 503")

    up = commands.add_parser("up", help="start tracker, workers and gateway on this machine and stream a demo")
    up.add_argument("--model", type=Path, default=None, help="source GGUF (default: the provisioned model)")
    up.add_argument("--shards", type=int, default=3)
    up.add_argument("--port", type=int, default=8080, help="gateway port")
    up.add_argument("--threads", type=int, default=1, help="llama.cpp threads per worker")
    up.add_argument("--prompt", default="Write a haiku about machines that share their work.")
    up.add_argument("--max-tokens", type=int, default=64)
    up.add_argument("--demo-only", action="store_true", help="stop after the demo answer instead of serving")

    bench = commands.add_parser("bench", help="measure whole-model, split, meshnet and recompute lanes; write results")
    bench.add_argument("--model", type=Path, default=None, help="source GGUF (default: the provisioned model)")
    bench.add_argument("--out", type=Path, default=Path("bench/results/bench.json"), help="results JSON")
    bench.add_argument("--report", type=Path, default=Path("bench/report"), help="folder for report.md and plots")
    bench.add_argument("--quick", action="store_true", help="fewer rounds, shorter outputs, concurrency 1 and 4")
    bench.add_argument("--threads", type=int, default=1, help="llama.cpp threads per context, every lane alike")
    bench.add_argument("--lanes", default=None, help="comma-separated lanes (default: all)")
    bench.add_argument("--budget", type=float, default=None, help="seconds the run may take (default 840; quick 300)")

    gate = commands.add_parser("gate", help="judge bench results against the performance contract (exit 0/1/2)")
    gate.add_argument("results", type=Path)
    gate.add_argument("--contract", type=Path, default=None, help="contract JSON (default: the packaged v1)")
    return parser


HANDLERS: dict[str, Handler] = {
    "provision": cmd_provision,
    "slice": cmd_slice,
    "certify": cmd_certify,
    "generate": cmd_generate,
    "worker": cmd_worker,
    "tracker": cmd_tracker,
    "gateway": cmd_gateway,
    "up": cmd_up,
    "bench": cmd_bench,
    "gate": cmd_gate,
}


def main(argv: Sequence[str] | None = None) -> int:
    # A child of `meshnet up`, the bench or a test harness ends when its supervisor does.
    watch_lifeline(os.environ)
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    for noisy in ("gguf", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return HANDLERS[args.command](args)
    except MeshnetError as error:
        print(f"meshnet {args.command}: error [{error.code}]: {error.message}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"meshnet {args.command}: error: {error.strerror or error}: {error.filename or ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
