"""``meshnet swarm init|invite|revoke`` and the identity each long-running command runs with.

``init`` and ``invite`` work on the swarm directory of ``--data-dir`` (the tracker's machine:
the CA and the invite book are there); ``revoke`` is an admin-authenticated call to the
running tracker, with an admin certificate minted here from the local CA.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from meshnet.core.addresses import check_advertise_address
from meshnet.core.durations import parse_duration
from meshnet.core.errors import InvalidArgument
from meshnet.core.swarm_options import SecurityOptions, SwarmArguments
from meshnet.membership.join import resolve_security
from meshnet.membership.tracker_client import TrackerClient
from meshnet.security.certificates import SwarmAuthority, ca_fingerprint
from meshnet.security.invites import InviteLedger, JoinToken, SwarmBook, invite_mac_key
from meshnet.security.swarm_dir import book_path, init_swarm, load_authority, mint_identity, swarm_dir
from meshnet.tracker.etcd.client import EtcdClient, parse_endpoints
from meshnet.tracker.etcd.invites import EtcdInvites
from meshnet.tracker.swarm_service import read_join_address
from meshnet.wire.tls import LinkSecurity

ADMIN_CERT_LIFETIME_S = 3600.0


def run_swarm(arguments: SwarmArguments, data_dir: Path, say: Callable[[str], None]) -> int:
    if arguments.action == "init":
        authority = init_swarm(data_dir, time.time())
        say(f"swarm created in {swarm_dir(data_dir)}")
        say(f"CA fingerprint {authority.fingerprint}")
        return 0
    if arguments.action == "invite":
        say(str(create_invite(arguments, data_dir)))
        return 0
    if not arguments.node:
        raise InvalidArgument("name the node to revoke: meshnet swarm revoke NODE_ID")
    newly, was_routed = asyncio.run(_revoke(arguments.tracker, admin_security(data_dir), arguments.node))
    state = "revoked" if newly else "was already revoked"
    say(f"node {arguments.node} {state}; {'removed from routing' if was_routed else 'it was not routed'}")
    return 0


def create_invite(arguments: SwarmArguments, data_dir: Path) -> JoinToken:
    authority = load_authority(data_dir)
    join_address = arguments.join_address or read_join_address(data_dir) or "127.0.0.1:7071"
    # A joiner dials this: a wildcard (a tracker on 0.0.0.0 before it announced) would send it home.
    check_advertise_address(join_address, flag="--join-address")
    expires_at = time.time() + parse_duration(arguments.expires)
    with _invite_ledger(arguments.store, data_dir, authority) as ledger:
        secret = ledger.create_invite(arguments.role, expires_at_unix_s=expires_at, max_uses=arguments.uses)
    return JoinToken(ca_fingerprint(authority.cert_pem), secret, join_address)


@contextlib.contextmanager
def _invite_ledger(store: str, data_dir: Path, authority: SwarmAuthority) -> Iterator[InviteLedger]:
    """The replicas' etcd store when ``--store`` names it (every replica redeems from there), else
    the book of this data dir (the one tracker that runs on it). Invites in etcd are sealed with
    a key derived from ``authority``'s private key: replicas refuse any record without it."""
    if store:
        client = EtcdClient(parse_endpoints(store))
        try:
            yield EtcdInvites(client, invite_mac_key(authority.key_pem))
        finally:
            client.close()
        return
    book = SwarmBook(book_path(data_dir))
    try:
        yield book
    finally:
        book.close()


def admin_security(data_dir: Path) -> LinkSecurity:
    """A short-lived admin identity minted from the local CA (this machine holds the swarm)."""
    authority = load_authority(data_dir)
    node = mint_identity(data_dir, authority, "admin", node_id="admin", role="admin", now_unix_s=time.time())
    return LinkSecurity(node)


async def _revoke(tracker: str, security: LinkSecurity, node_id: str) -> tuple[bool, bool]:
    async with TrackerClient(tracker, security=security, timeout_s=10.0) as client:
        return await client.revoke(node_id)


def node_security(
    options: SecurityOptions, data_dir: Path, name: str, addresses: tuple[str | None, ...]
) -> LinkSecurity | None:
    """The identity a worker or gateway runs with (``--identity``, stored, ``--join``, or ``--insecure``)."""
    return resolve_security(
        options, data_dir=data_dir, name=name, addresses=tuple(address for address in addresses if address)
    )
