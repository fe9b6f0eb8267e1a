"""``meshnet swarm init|invite|revoke``: the swarm's identity subcommands in the ``swarm`` group.

Kept apart from ``cli.commands.swarm`` (which acts on them and imports grpc and cryptography) because the
parser is built for every command and must stay cheap to import.
"""

from __future__ import annotations

import argparse

from meshnet.cli.flags import add_config_arguments, config_from_arguments
from meshnet.core.swarm_options import SwarmArguments

# Each subcommand shows only the flags that mean something to it.
_SKIPPED = {
    "init": ("action", "node", "role", "expires", "uses", "join_address", "tracker"),
    "invite": ("action", "node", "tracker"),
    "revoke": ("action", "role", "expires", "uses", "join_address"),
}
_HELP = {
    "init": "create the swarm CA and the tracker's certificate in DATA_DIR/swarm (keys stay there, 0600)",
    "invite": "print a join token for a worker, gateway or admin (expiry and number of uses)",
    "revoke": "refuse a node everywhere: out of routing at once, its certificate refused within a heartbeat",
}


def add_identity_arguments(swarm_commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for action, skipped in _SKIPPED.items():
        parser = swarm_commands.add_parser(action, help=_HELP[action], description=_HELP[action])
        add_config_arguments(parser, SwarmArguments, skip=skipped)
        parser.set_defaults(swarm_run=cmd_identity, swarm_action=action)


def cmd_identity(args: argparse.Namespace) -> int:
    from meshnet.cli.commands.swarm import run_swarm

    arguments = config_from_arguments(SwarmArguments, args, fixed={"action": args.swarm_action})
    return run_swarm(arguments, args.data_dir, print)
