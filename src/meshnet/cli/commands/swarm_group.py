"""``meshnet swarm ...``: the swarm's identity and access, one group of subcommands.

Each family adds its own parsers from its module (``identity``, ``api_keys``, ``quarantine``);
this module only gathers them, so building the parser imports none of the code that acts.
"""

from __future__ import annotations

import argparse

from meshnet.cli.common import Command, Handler


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


def swarm_commands() -> dict[str, Command]:
    return {
        "swarm": Command(
            cmd_swarm,
            "the swarm's identity and access: init the CA, invite and revoke nodes, API keys, quarantine",
            build=add_swarm_arguments,
        ),
    }
