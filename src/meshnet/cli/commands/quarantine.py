"""``meshnet swarm quarantine list|clear``: what the audit caught, with its evidence; let a node back.

``list`` shows each quarantined node, why, since when, and the evidence the auditor's order
carried (the audited requests, each run's route and whether its output matched the original's;
outputs are digests keyed per audit, never text). ``clear NODE_ID`` is an operator's decision
after looking at the node (a fault fixed, say); the tracker otherwise keeps a quarantined id
out of routes for good, across its own restarts. A cleared node rejoins by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from meshnet.core.audit_evidence import QuarantineEntry
from meshnet.core.ids import NodeId
from meshnet.core.tracking import QuarantineOrder
from meshnet.membership.tracker_client import TrackerClient
from meshnet.wire.tls import LinkSecurity


def add_quarantine_arguments(swarm_commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    quarantine = swarm_commands.add_parser("quarantine", help="nodes an audit caught: list them, or lift one")
    actions = quarantine.add_subparsers(dest="quarantine_action", required=True, help="list or clear (required)")
    listing = actions.add_parser("list", help="every quarantined node with the audit's evidence")
    clear = actions.add_parser("clear", help="let NODE_ID register and be routed again")
    clear.add_argument("node_id", help="the node's id, as the tracker's log names it (required)")
    for action in (listing, clear):
        action.add_argument(
            "--tracker",
            required=True,
            help="tracker address host:port, or its replicas in order a:7070,b:7070 (required)",
        )
        action.add_argument(
            "--insecure",
            action="store_true",
            help="talk to a plaintext (--insecure) tracker; default: as admin of DATA_DIR's swarm CA",
        )
    quarantine.set_defaults(swarm_run=cmd_quarantine)


async def _clear(tracker: str, node_id: NodeId, security: LinkSecurity | None) -> bool:
    async with TrackerClient(tracker, timeout_s=5.0, security=security) as client:
        answer = await client.quarantine(QuarantineOrder(node_id, "cleared by an operator", clear=True))
    return answer.known


async def _list(tracker: str, security: LinkSecurity | None) -> tuple[QuarantineEntry, ...]:
    async with TrackerClient(tracker, timeout_s=5.0, security=security) as client:
        return await client.list_quarantine()


def _describe(entry: QuarantineEntry) -> list[str]:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(entry.since))
    lines = [f"node {entry.node_id}  quarantined {since}", f"  reason: {entry.reason}"]
    if entry.request_id is not None:
        lines.append(f"  record marked unverified: {entry.request_id}")
    if entry.evidence is None:
        lines.append("  evidence: none (an admin's order)")
        return lines
    lines.append(f"  evidence ({entry.evidence.rule}):")
    for audit in entry.evidence.audits:
        lines.append(f"    request {audit.request_id}:")
        for index, run in enumerate(audit.runs):
            label = "original" if index == 0 else f"replay {index}"
            same = "" if index == 0 else ("  same output" if run.output == audit.original.output else "  differs")
            lines.append(f"      {label:<9} {' -> '.join(run.nodes)}  output {run.output[:12]}{same}")
    return lines


def cmd_quarantine(args: argparse.Namespace) -> int:
    # Imported here: minting the admin identity needs the CA, which only this command uses.
    from meshnet.cli.commands.swarm import admin_security

    security = None if args.insecure else admin_security(args.data_dir)
    if args.quarantine_action == "list":
        entries = asyncio.run(_list(args.tracker, security))
        print("\n".join(line for entry in entries for line in _describe(entry)) or "no node is quarantined")
        return 0
    node_id = NodeId(args.node_id)
    if asyncio.run(_clear(args.tracker, node_id, security)):
        print(f"node {node_id}: quarantine cleared; it may register again")
    else:
        print(f"node {node_id} was not quarantined")
    return 0
