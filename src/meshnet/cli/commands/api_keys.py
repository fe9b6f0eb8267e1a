"""``meshnet swarm api-key create|list|revoke``: the gateway's API keys, kept in the data dir.

Its own module so the ``swarm`` group can gain other subcommands (init, invite, revoke) beside
it. ``create`` prints the key once; the store keeps only its SHA-256 digest (gateway/keys.py).
"""

from __future__ import annotations

import argparse
import sys
import time

from meshnet.gateway.keys import ApiKeyStore, store_path


def add_api_key_arguments(swarm_commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``api-key`` and its subcommands to the ``swarm`` group's subparsers."""
    api_key = swarm_commands.add_parser("api-key", help="create, list and revoke the gateway's API keys")
    actions = api_key.add_subparsers(dest="api_key_action", required=True, help="create, list or revoke (required)")
    create = actions.add_parser("create", help="make a key (printed once; only its hash is stored)")
    create.add_argument("name", help="a name for the key: who or what uses it (required)")
    create.add_argument(
        "--admin",
        action="store_true",
        help="an admin key: /v1/status and telemetry show it every key's requests (others see their own)",
    )
    actions.add_parser("list", help="list the keys' names and states (never the keys)")
    revoke = actions.add_parser("revoke", help="revoke a key: the gateway refuses it from the next request")
    revoke.add_argument("name", help="the key's name, as `list` shows it (required)")
    api_key.set_defaults(swarm_run=cmd_api_key)


def cmd_api_key(args: argparse.Namespace) -> int:
    store = ApiKeyStore(store_path(args.data_dir))
    if args.api_key_action == "create":
        key = store.create(args.name, admin=args.admin)
        print(key)
        kind = "admin api key" if args.admin else "api key"
        print(f"{kind} {args.name!r} created; it is shown only now (stored hashed in {store.path})", file=sys.stderr)
    elif args.api_key_action == "list":
        for info in store.list():
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(info.created_at))
            state = "active" if info.active else "revoked"
            role = "admin" if info.admin else "key"
            print(f"{info.name}\t{info.key_id}\t{role}\t{state}\tcreated {created} UTC")
    else:
        store.revoke(args.name)
        print(f"api key {args.name!r} revoked")
    return 0
