"""Join invites in etcd: a token made for one tracker replica is redeemed at any of them.

A single tracker keeps its invites in its swarm book (``security.invites.SwarmBook``, a SQLite
file in its data dir). Replicas run on copies of that dir, so an invite written to one copy after
the copies were made is unknown to the others, and one written before could be spent once at
each. With ``--store etcd://...``, ``meshnet swarm invite --store`` writes the invite to
``invites/<sha256 of its secret>`` and every replica redeems it there: a use is spent by a
transaction that compares the key's mod_revision, so two joiners racing for the last use at two
replicas cannot both get it (the promise the book keeps with its SQLite write transaction).

Each invite lives under a lease of its own that ends ``EXPIRED_KEPT_S`` after the invite
expires: until then a late joiner is told it expired; after, etcd forgets it.

etcd is reached over plain HTTP without auth, so whoever can write to it could write an invite
of their own: every record carries an HMAC (``security.invites.invite_mac``) keyed by a key
derived from the swarm CA's private key, and a replica refuses a record whose MAC does not verify.

A redemption names itself with a nonce written into the record: the client retries a transaction
that timed out on the next member, and if the first was applied after all, the retry's compare
fails; the record then carries our nonce, and the use already spent is ours, not a second one.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from meshnet.core.errors import StorageDamaged, StorageUnavailable
from meshnet.security.identity import Role, check_role
from meshnet.security.invites import (
    Invite,
    InviteRefused,
    InviteUnsealed,
    check_invite,
    check_invite_mac,
    invite_digest,
    invite_mac,
    new_invite,
)
from meshnet.tracker.etcd.client import EtcdClient, KeyValue, Put
from meshnet.tracker.etcd.store import KEY_PREFIX, MAX_CAS_ATTEMPTS, decode_object

logger = logging.getLogger(__name__)

INVITES_PREFIX = KEY_PREFIX + "invites/"
EXPIRED_KEPT_S = 86_400
"""How long an expired invite is still refused as expired (not as unknown) before etcd drops it."""
MAX_LEASE_TTL_S = 9_000_000_000
"""etcd's largest lease TTL: an invite valid for longer is kept that long."""
RECENT_REDEMPTIONS = 64
"""Nonces of the latest redemptions kept in a record: a redeem looks for its own right after its
transaction's outcome was unknown, so it need outlast only the redemptions racing meanwhile."""


@dataclass(frozen=True)
class StoredInvite:
    """An invite as kept in etcd: the invite and the nonces of its latest redemptions."""

    invite: Invite
    redeemed: tuple[str, ...] = ()


def encode_invite(mac_key: bytes, digest: str, stored: StoredInvite) -> bytes:
    invite = stored.invite
    return json.dumps(
        {
            "role": invite.role,
            "expires_at": invite.expires_at_unix_s,
            "max_uses": invite.max_uses,
            "uses": invite.uses,
            "redeemed": list(stored.redeemed[-RECENT_REDEMPTIONS:]),
            "mac": invite_mac(mac_key, digest, invite),
        }
    ).encode()


def decode_invite(kv: KeyValue, mac_key: bytes) -> StoredInvite:
    """A stored invite; StorageDamaged naming the key if malformed, InviteUnsealed (logged) if
    its MAC does not verify (whoever wrote it)."""
    data = decode_object(kv, "role", "expires_at", "max_uses", "uses", "redeemed", "mac")
    try:
        invite = Invite(check_role(data["role"]), float(data["expires_at"]), int(data["max_uses"]), int(data["uses"]))
        redeemed = tuple(str(nonce) for nonce in data["redeemed"])
        mac = str(data["mac"])
    except (ValueError, TypeError) as error:
        raise StorageDamaged(f"etcd key {kv.key} holds a malformed invite: {error}") from None
    try:
        check_invite_mac(mac_key, kv.key.removeprefix(INVITES_PREFIX), invite, mac)
    except InviteUnsealed:
        logger.warning("etcd key %s holds an invite without the swarm's seal: refused (who writes to etcd?)", kv.key)
        raise
    return StoredInvite(invite, redeemed)


class EtcdInvites:
    """``InviteLedger`` over the replicas' etcd store; blocking calls (run them off the event loop).
    ``mac_key`` is ``security.invites.invite_mac_key`` of the swarm's CA key."""

    def __init__(self, client: EtcdClient, mac_key: bytes, clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._mac_key = mac_key
        self._clock = clock

    def create_invite(self, role: str, *, expires_at_unix_s: float, max_uses: int) -> str:
        secret, invite = new_invite(role, expires_at_unix_s=expires_at_unix_s, max_uses=max_uses)
        remaining = max(0.0, expires_at_unix_s - self._clock())
        ttl = min(math.ceil(remaining) + EXPIRED_KEPT_S, MAX_LEASE_TTL_S)
        digest = invite_digest(secret)
        value = encode_invite(self._mac_key, digest, StoredInvite(invite))
        self._client.put(INVITES_PREFIX + digest, value, self._client.grant_lease(ttl))
        return secret

    def redeem(self, secret: str, now_unix_s: float) -> Role:
        digest = invite_digest(secret)
        key = INVITES_PREFIX + digest
        nonce = secrets.token_hex(8)
        for _ in range(MAX_CAS_ATTEMPTS):
            stored = self._client.get(key)
            if stored is None:
                raise InviteRefused(
                    "this invite is unknown to the tracker's replicas (forged, from another swarm, "
                    "or made without `meshnet swarm invite --store` naming their etcd store)"
                )
            record = decode_invite(stored, self._mac_key)
            if nonce in record.redeemed:
                return record.invite.role  # our transaction was applied although its reply was lost
            invite = check_invite(record.invite, now_unix_s)
            spent = StoredInvite(replace(invite, uses=invite.uses + 1), (*record.redeemed, nonce))
            # Under the key's own lease: a put without one would keep a spent invite forever.
            write = Put(key, encode_invite(self._mac_key, digest, spent), stored.lease)
            try:
                if self._client.commit_if([(key, stored.mod_revision)], [write]):
                    return invite.role
            except StorageUnavailable:
                pass  # outcome unknown: the next read tells whether it was applied (our nonce)
        raise StorageUnavailable("this invite kept being spent at other tracker replicas meanwhile; retry")
