"""Join tokens and the tracker's book of invites and revocations (one SQLite file).

A token is ``meshnet-join:<ca-fingerprint>:<secret>@<host:port>``: the fingerprint lets the
joiner pin the tracker's CA before it sends anything, the secret is the invite (stored only as
its SHA-256), the address is the tracker's join port. Uses are counted inside one SQLite
write transaction, so two joiners racing for the last use cannot both get it, and the count
survives a tracker restart. Tracker replicas sharing an etcd store keep their invites there
instead (``tracker.etcd.invites``), under the same rules (``new_invite``, ``check_invite``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from meshnet.core.errors import InvalidArgument, PermissionDenied
from meshnet.security.identity import INVITE_ROLES, Role, check_role

TOKEN_PREFIX = "meshnet-join:"
_TOKEN = re.compile(r"^meshnet-join:([0-9a-f]{64}):([A-Za-z0-9_-]{16,128})@(\S{1,255}:[0-9]{1,5})$")
MAX_INVITE_USES = 10_000


INVITE_MAC_LABEL = b"meshnet invite record MAC v1"
"""Fixed label the invite MAC key is derived under: the CA key itself is never used as one."""


class InviteRefused(PermissionDenied):
    """An invite that is unknown (forged), expired or used up: the joiner gets no certificate."""

    code = "invite_refused"


class InviteUnsealed(InviteRefused):
    """A stored invite whose MAC does not verify: written by someone without the swarm's CA key
    (anyone who can write to the replicas' etcd), so it grants nothing."""


@dataclass(frozen=True)
class JoinToken:
    ca_fingerprint: str
    secret: str
    join_address: str

    def __str__(self) -> str:
        return f"{TOKEN_PREFIX}{self.ca_fingerprint}:{self.secret}@{self.join_address}"


@dataclass(frozen=True)
class Invite:
    role: Role
    expires_at_unix_s: float
    max_uses: int
    uses: int


def parse_token(text: str) -> JoinToken:
    match = _TOKEN.match(text.strip())
    if match is None:
        raise InvalidArgument("a join token looks like meshnet-join:<64 hex>:<secret>@<host:port>")
    return JoinToken(match.group(1), match.group(2), match.group(3))


def invite_digest(secret: str) -> str:
    """What is kept of an invite's secret: a stolen book or store holds no usable invite."""
    return hashlib.sha256(secret.encode()).hexdigest()


def invite_mac_key(ca_key_pem: bytes) -> bytes:
    """The key invites kept outside the data dir (the replicas' etcd) are sealed with: derived
    from the swarm CA's private key, which every replica and `swarm invite` hold and a writer of
    etcd does not. HMAC of a fixed label, so a leaked MAC key gives nothing of the CA key."""
    return hmac.new(ca_key_pem, INVITE_MAC_LABEL, hashlib.sha256).digest()


def invite_mac(key: bytes, digest: str, invite: Invite) -> str:
    """HMAC-SHA256 over what an invite grants (its digest, role, expiry and use limit), not over
    its use count, which every redemption changes."""
    sealed = f"{digest}\n{invite.role}\n{float(invite.expires_at_unix_s)!r}\n{int(invite.max_uses)}"
    return hmac.new(key, sealed.encode(), hashlib.sha256).hexdigest()


def check_invite_mac(key: bytes, digest: str, invite: Invite, mac: str) -> None:
    """``InviteUnsealed`` unless ``mac`` is the one ``invite_mac`` gives (compared in constant time)."""
    if not hmac.compare_digest(invite_mac(key, digest, invite), mac):
        raise InviteUnsealed("this invite's stored record lacks the swarm's seal (not made by `meshnet swarm invite`)")


def new_invite(role: str, *, expires_at_unix_s: float, max_uses: int) -> tuple[str, Invite]:
    """A new invite's secret (shown once) and the invite to keep under its digest; InvalidArgument
    for a role no invite grants or a use count out of range."""
    checked = check_role(role)
    if checked not in INVITE_ROLES:
        raise InvalidArgument(f"an invite grants one of {', '.join(INVITE_ROLES)}, not {role!r}")
    if not 1 <= max_uses <= MAX_INVITE_USES:
        raise InvalidArgument(f"uses must be in [1, {MAX_INVITE_USES}], got {max_uses}")
    return secrets.token_urlsafe(24), Invite(checked, expires_at_unix_s, max_uses, 0)


class InviteLedger(Protocol):
    """Where invites are kept and spent: the swarm book of one tracker, or the etcd store its
    replicas share (``tracker.etcd.invites``). Blocking calls."""

    def create_invite(self, role: str, *, expires_at_unix_s: float, max_uses: int) -> str:
        """A new invite's secret (shown once; only its digest is kept)."""
        ...

    def redeem(self, secret: str, now_unix_s: float) -> Role:
        """Spend one use of the invite ``secret``: the role it grants, or ``InviteRefused``."""
        ...


class SwarmBook:
    """Invites and revoked node ids, in one SQLite file under the swarm directory."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS invites (
                digest TEXT PRIMARY KEY, role TEXT NOT NULL, expires_at REAL NOT NULL,
                max_uses INTEGER NOT NULL, uses INTEGER NOT NULL DEFAULT 0);
            CREATE TABLE IF NOT EXISTS revoked (node_id TEXT PRIMARY KEY, revoked_at REAL NOT NULL);
            CREATE TABLE IF NOT EXISTS issued (
                node_id TEXT PRIMARY KEY, role TEXT NOT NULL, issued_at REAL NOT NULL);
            """
        )

    def close(self) -> None:
        self._db.close()

    def create_invite(self, role: str, *, expires_at_unix_s: float, max_uses: int) -> str:
        """A new invite's secret (shown once; only its digest is kept)."""
        secret, invite = new_invite(role, expires_at_unix_s=expires_at_unix_s, max_uses=max_uses)
        self._db.execute(
            "INSERT INTO invites (digest, role, expires_at, max_uses) VALUES (?, ?, ?, ?)",
            (invite_digest(secret), invite.role, invite.expires_at_unix_s, invite.max_uses),
        )
        return secret

    def redeem(self, secret: str, now_unix_s: float) -> Role:
        """Spend one use of the invite ``secret``: the role it grants, or ``InviteRefused``."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            row = self._db.execute(
                "SELECT role, expires_at, max_uses, uses FROM invites WHERE digest = ?", (invite_digest(secret),)
            ).fetchone()
            stored = None if row is None else Invite(check_role(row[0]), row[1], row[2], row[3])
            invite = check_invite(stored, now_unix_s)
            self._db.execute("UPDATE invites SET uses = uses + 1 WHERE digest = ?", (invite_digest(secret),))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return invite.role

    def record_issued(self, node_id: str, role: Role, now_unix_s: float) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO issued (node_id, role, issued_at) VALUES (?, ?, ?)", (node_id, role, now_unix_s)
        )

    def revoke(self, node_id: str, now_unix_s: float) -> bool:
        """Revoke ``node_id``; False when it was revoked already."""
        cursor = self._db.execute(
            "INSERT OR IGNORE INTO revoked (node_id, revoked_at) VALUES (?, ?)", (node_id, now_unix_s)
        )
        return cursor.rowcount == 1

    def revoked(self) -> frozenset[str]:
        return frozenset(row[0] for row in self._db.execute("SELECT node_id FROM revoked"))


def check_invite(invite: Invite | None, now_unix_s: float) -> Invite:
    """``invite`` if one more use of it may be spent now; else ``InviteRefused`` saying why."""
    if invite is None:
        raise InviteRefused("this invite is unknown to the tracker (forged, or from another swarm)")
    if now_unix_s >= invite.expires_at_unix_s:
        raise InviteRefused("this invite has expired; ask the swarm's owner for a new one")
    if invite.uses >= invite.max_uses:
        raise InviteRefused(f"this invite was already used {invite.uses} of {invite.max_uses} times")
    return invite
