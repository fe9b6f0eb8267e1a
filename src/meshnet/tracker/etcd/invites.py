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
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import replace

from meshnet.core.errors import StorageDamaged, StorageUnavailable
from meshnet.security.identity import Role, check_role
from meshnet.security.invites import Invite, InviteRefused, check_invite, invite_digest, new_invite
from meshnet.tracker.etcd.client import EtcdClient, KeyValue, Put
from meshnet.tracker.etcd.store import KEY_PREFIX, MAX_CAS_ATTEMPTS, decode_object

INVITES_PREFIX = KEY_PREFIX + "invites/"
EXPIRED_KEPT_S = 86_400
"""How long an expired invite is still refused as expired (not as unknown) before etcd drops it."""
MAX_LEASE_TTL_S = 9_000_000_000
"""etcd's largest lease TTL: an invite valid for longer is kept that long."""


def encode_invite(invite: Invite) -> bytes:
    return json.dumps(
        {
            "role": invite.role,
            "expires_at": invite.expires_at_unix_s,
            "max_uses": invite.max_uses,
            "uses": invite.uses,
        }
    ).encode()


def decode_invite(kv: KeyValue) -> Invite:
    """A stored invite; StorageDamaged naming the key if malformed (whoever wrote it)."""
    data = decode_object(kv, "role", "expires_at", "max_uses", "uses")
    try:
        return Invite(check_role(data["role"]), float(data["expires_at"]), int(data["max_uses"]), int(data["uses"]))
    except (ValueError, TypeError) as error:
        raise StorageDamaged(f"etcd key {kv.key} holds a malformed invite: {error}") from None


class EtcdInvites:
    """``InviteLedger`` over the replicas' etcd store; blocking calls (run them off the event loop)."""

    def __init__(self, client: EtcdClient, clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._clock = clock

    def create_invite(self, role: str, *, expires_at_unix_s: float, max_uses: int) -> str:
        secret, invite = new_invite(role, expires_at_unix_s=expires_at_unix_s, max_uses=max_uses)
        remaining = max(0.0, expires_at_unix_s - self._clock())
        ttl = min(math.ceil(remaining) + EXPIRED_KEPT_S, MAX_LEASE_TTL_S)
        self._client.put(INVITES_PREFIX + invite_digest(secret), encode_invite(invite), self._client.grant_lease(ttl))
        return secret

    def redeem(self, secret: str, now_unix_s: float) -> Role:
        key = INVITES_PREFIX + invite_digest(secret)
        for _ in range(MAX_CAS_ATTEMPTS):
            stored = self._client.get(key)
            if stored is None:
                raise InviteRefused(
                    "this invite is unknown to the tracker's replicas (forged, from another swarm, "
                    "or made without `meshnet swarm invite --store` naming their etcd store)"
                )
            invite = check_invite(decode_invite(stored), now_unix_s)
            # Under the key's own lease: a put without one would keep a spent invite forever.
            spent = Put(key, encode_invite(replace(invite, uses=invite.uses + 1)), stored.lease)
            if self._client.commit_if([(key, stored.mod_revision)], [spent]):
                return invite.role
        raise StorageUnavailable("this invite kept being spent at other tracker replicas meanwhile; retry")
