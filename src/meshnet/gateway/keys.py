"""The gateway's API keys: created once, stored only as hashes, checked in constant time.

A key is ``mn-`` followed by 32 random bytes (base64url); the store keeps its SHA-256 digest,
never the key, in ``DATA_DIR/api-keys.sqlite3`` (mode 0600). A 256-bit random key needs no
slow password hash: nobody can guess it, so its plain digest is enough to check it. Each check
reads the store afresh, so ``meshnet swarm api-key revoke`` takes effect on the next request of
a running gateway. Keys are compared with ``hmac.compare_digest`` against every active digest,
so timing tells nothing about how close a guess was.

A key is identified by an id (``key-`` + 16 hex digits, random, never reused), not by its name:
the name is the CLI's handle (create and revoke by name), while the requests, telemetry and
status a key owns are keyed on its id, so a key made under a revoked key's name reads nothing of
the old one. An admin key (``create --admin``, and the operator's ``DATA_DIR/api-key`` that
``meshnet up`` writes) sees every key's requests on ``/v1/status`` and their telemetry.

``ensure_client_key`` is what ``meshnet up`` uses: an admin key written to ``DATA_DIR/api-key``
(0600) for the operator's local clients, registered in the store, made once and reused after.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from meshnet.core.errors import FailedPrecondition, InvalidArgument

KEY_PREFIX = "mn-"
KEY_BYTES = 32
STORE_NAME = "api-keys.sqlite3"
CLIENT_KEY_FILE = "api-key"
CLIENT_KEY_NAME = "local"
"""The name ``meshnet up`` gives the key it writes to ``DATA_DIR/api-key``."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

KEY_ID_PREFIX = "key-"
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS keys (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        digest BLOB NOT NULL,
        created_at REAL NOT NULL,
        revoked_at REAL,
        admin INTEGER NOT NULL DEFAULT 0
    )""",
    # One active key per name: the name is how the CLI finds the key to revoke.
    "CREATE UNIQUE INDEX IF NOT EXISTS keys_active_name ON keys (name) WHERE revoked_at IS NULL",
)
_OLD_TABLE = "api_keys"
"""The store before keys had ids (name was the key): its rows are moved over once, with fresh ids."""


@dataclass(frozen=True)
class ApiKeyInfo:
    """What ``list`` shows of one key: never the key, never its digest."""

    name: str
    created_at: float
    revoked_at: float | None = None
    key_id: str = ""
    admin: bool = False

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class KeyIdentity:
    """Who a presented key is: its id (what owns requests), its name (for people), its rights."""

    key_id: str
    name: str
    admin: bool = False


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def new_key_id() -> str:
    return KEY_ID_PREFIX + secrets.token_hex(8)


def new_api_key() -> str:
    return KEY_PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(KEY_BYTES)).decode().rstrip("=")


def check_key_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"api key name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def store_path(data_dir: Path) -> Path:
    return data_dir / STORE_NAME


def _private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist (before SQLite opens it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(descriptor)
    os.chmod(path, 0o600)


class ApiKeyStore:
    """Hashed API keys in one SQLite file; every call opens, acts and closes (no held state)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        _private_file(self.path)
        connection = sqlite3.connect(self.path, timeout=5.0)
        try:
            with connection:
                for statement in _SCHEMA:
                    connection.execute(statement)
                _move_old_rows(connection)
                yield connection
        finally:
            connection.close()

    def create(self, name: str, *, admin: bool = False) -> str:
        """Make a key named ``name`` and return it: the only time the key itself is seen."""
        key = new_api_key()
        self.add(name, key, admin=admin)
        return key

    def add(self, name: str, key: str, *, admin: bool = False) -> str:
        """Register an existing key under ``name`` (``ensure_client_key`` reuses its file); its id."""
        check_key_name(name)
        key_id = new_key_id()
        with self._connect() as db:
            if db.execute("SELECT 1 FROM keys WHERE name = ? AND revoked_at IS NULL", (name,)).fetchone():
                raise FailedPrecondition(f"an active api key named {name!r} exists; revoke it first")
            db.execute(
                "INSERT INTO keys (id, name, digest, created_at, revoked_at, admin) VALUES (?, ?, ?, ?, NULL, ?)",
                (key_id, name, key_digest(key), time.time(), int(admin)),
            )
        return key_id

    def revoke(self, name: str) -> None:
        with self._connect() as db:
            changed = db.execute(
                "UPDATE keys SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL", (time.time(), name)
            ).rowcount
        if not changed:
            raise InvalidArgument(f"no active api key named {name!r}")

    def list(self) -> tuple[ApiKeyInfo, ...]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT name, created_at, revoked_at, id, admin FROM keys ORDER BY created_at, rowid"
            ).fetchall()
        return tuple(
            ApiKeyInfo(str(name), float(created), revoked, str(key_id), bool(admin))
            for name, created, revoked, key_id, admin in rows
        )

    def verify(self, key: str) -> KeyIdentity | None:
        """The identity of the active key equal to ``key``, or None."""
        if not key.startswith(KEY_PREFIX):
            return None
        digest = key_digest(key)
        with self._connect() as db:
            rows = db.execute("SELECT id, name, admin, digest FROM keys WHERE revoked_at IS NULL").fetchall()
        found: KeyIdentity | None = None
        for key_id, name, admin, stored in rows:  # no early exit: every active digest is compared
            if hmac.compare_digest(bytes(stored), digest):
                found = KeyIdentity(str(key_id), str(name), bool(admin))
        return found


def _move_old_rows(db: sqlite3.Connection) -> None:
    """Give the keys of a store written before ids their ids (once), then drop the old table."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (_OLD_TABLE,)).fetchone() is None:
        return
    rows = db.execute(f"SELECT name, digest, created_at, revoked_at FROM {_OLD_TABLE}").fetchall()
    for name, digest, created_at, revoked_at in rows:
        db.execute(
            "INSERT INTO keys (id, name, digest, created_at, revoked_at, admin) VALUES (?, ?, ?, ?, ?, ?)",
            (new_key_id(), name, digest, created_at, revoked_at, int(name == CLIENT_KEY_NAME)),
        )
    db.execute(f"DROP TABLE {_OLD_TABLE}")


def ensure_client_key(data_dir: Path) -> Path:
    """``DATA_DIR/api-key``, created (0600) and registered if missing; returns its path."""
    path = data_dir / CLIENT_KEY_FILE
    store = ApiKeyStore(store_path(data_dir))
    if path.exists() and store.verify(path.read_text().strip()) is not None:
        return path
    # Missing, or its key was revoked: a revoked key is never brought back, a new one replaces it.
    key = new_api_key()
    if CLIENT_KEY_NAME in {info.name for info in store.list() if info.active}:
        store.revoke(CLIENT_KEY_NAME)
    store.add(CLIENT_KEY_NAME, key, admin=True)  # the operator's own key
    _private_file(path)
    path.write_text(key + "\n")
    return path


def read_client_key(data_dir: Path) -> str:
    """The key ``meshnet up`` wrote to ``DATA_DIR/api-key``; a clear error when there is none."""
    path = data_dir / CLIENT_KEY_FILE
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        raise FailedPrecondition(f"no api key at {path}: run `meshnet up` or `meshnet swarm api-key create`") from None
    if not key.startswith(KEY_PREFIX):
        raise FailedPrecondition(f"{path} does not hold a meshnet api key")
    return key
