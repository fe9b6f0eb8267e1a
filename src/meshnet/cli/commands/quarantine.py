"""``meshnet swarm quarantine clear NODE_ID``: let a node the audit caught register again.

An operator's decision after looking at the node (a fault fixed, say); the tracker otherwise
keeps a quarantined id out of routes for good, across its own restarts.
"""

from __future__ import annotations

import argparse
import asyncio

from meshnet.core.ids import NodeId
from meshnet.core.tracking import QuarantineOrder
from meshnet.membership.tracker_client import TrackerClient
from meshnet.wire.tls import LinkSecurity


def add_quarantine_arguments(swarm_commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    quarantine = swarm_commands.add_parser("quarantine", help="lift the quarantine of a node an audit caught")
    actions = quarantine.add_subparsers(dest="quarantine_action", required=True, help="clear (required)")
    clear = actions.add_parser("clear", help="let NODE_ID register and be routed again")
    clear.add_argument("node_id", help="the node's id, as the tracker's log names it (required)")
    clear.add_argument("--tracker", required=True, help="tracker address host:port (required)")
    clear.add_argument(
        "--insecure",
        action="store_true",
        help="talk to a plaintext (--insecure) tracker; default: as admin of DATA_DIR's swarm CA",
    )
    quarantine.set_defaults(swarm_run=cmd_quarantine)


async def _clear(tracker: str, node_id: NodeId, security: LinkSecurity | None) -> bool:
    async with TrackerClient(tracker, timeout_s=5.0, security=security) as client:
        answer = await client.quarantine(QuarantineOrder(node_id, "cleared by an operator", clear=True))
    return answer.known


def cmd_quarantine(args: argparse.Namespace) -> int:
    # Imported here: minting the admin identity needs the CA, which only this command uses.
    from meshnet.cli.commands.swarm import admin_security

    node_id = NodeId(args.node_id)
    security = None if args.insecure else admin_security(args.data_dir)
    if asyncio.run(_clear(args.tracker, node_id, security)):
        print(f"node {node_id}: quarantine cleared; it may register again")
    else:
        print(f"node {node_id} was not quarantined")
    return 0
