"""``meshnet status``: the swarm's nodes, coverage and load, once or refreshed in place."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from meshnet.cli.arguments import StatusArguments
from meshnet.cli.common import Command
from meshnet.cli.flags import config_from_arguments

if TYPE_CHECKING:
    from meshnet.wire.tls import LinkSecurity


def cmd_status(args: argparse.Namespace) -> int:
    from meshnet.gateway.status.table import exit_status, fetch_status, render_status

    command = config_from_arguments(StatusArguments, args)
    api_key, security = _status_credentials(command, args.data_dir)
    while True:
        document, source = fetch_status(command.tracker, command.gateway, api_key=api_key, security=security)
        table = render_status(document, source)
        if not command.watch:
            print(table)
            return exit_status(document)
        # Home the cursor and clear, so the table redraws in place like `watch`.
        print("\x1b[H\x1b[2J" + table + f"\n(every {command.interval:g} s; Ctrl-C to stop)", flush=True)
        time.sleep(command.interval)


def _status_credentials(command: StatusArguments, data_dir: Path) -> tuple[str | None, LinkSecurity | None]:
    """What `meshnet status` proves itself with: the gateway's API key, or an admin identity."""
    if command.tracker:
        if command.insecure:
            return None, None
        from meshnet.cli.commands.swarm import admin_security

        return None, admin_security(data_dir)
    if command.api_key is not None:
        return command.api_key, None
    from meshnet.gateway.keys import CLIENT_KEY_FILE, read_client_key

    return (read_client_key(data_dir) if (data_dir / CLIENT_KEY_FILE).exists() else None), None


def status_commands() -> dict[str, Command]:
    return {
        "status": Command(
            cmd_status, "show nodes, layer coverage, gaps and load of a swarm (--watch refreshes)", (StatusArguments,)
        ),
    }
