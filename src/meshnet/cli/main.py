"""The ``meshnet`` command: builds the parser from every command module's table and dispatches.

Each subcommand lives in ``cli.commands`` by subject (models, serve, deploy, swarm, artifacts,
bench, status) and its flags are generated from its config dataclass (``cli.flags``), so a knob
and its default are written once, in the config. The CLI is the one place that prints for humans;
everything below logs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from meshnet import __version__
from meshnet.cli.commands.artifacts import artifact_commands
from meshnet.cli.commands.bench import bench_commands
from meshnet.cli.commands.deploy import deploy_commands
from meshnet.cli.commands.models import model_commands
from meshnet.cli.commands.plan import plan_commands
from meshnet.cli.commands.serve import serve_commands
from meshnet.cli.commands.status import status_commands
from meshnet.cli.commands.swarm_group import swarm_commands
from meshnet.cli.common import Command
from meshnet.cli.flags import add_config_arguments
from meshnet.core.errors import InvalidArgument, MeshnetError
from meshnet.process.lifeline import watch_lifeline


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "meshnet"


def _commands() -> dict[str, Command]:
    # Each table imports its configs when called: building the parser must not import llama.cpp
    # or grpc for every command. The order is the order of `meshnet --help`.
    return {
        **model_commands(),
        **plan_commands(),
        **serve_commands(),
        **deploy_commands(),
        **swarm_commands(),
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
