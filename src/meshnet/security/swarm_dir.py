"""Where a swarm's keys live on disk: ``DATA_DIR/swarm/`` (the CA's side) and node identities.

Layout, every directory 0700 and every file 0600 (keys never leave the data dir):
  swarm/ca.pem, swarm/ca.key      the swarm CA
  swarm/book.sqlite3              invites and revocations (``invites.SwarmBook``)
  swarm/nodes/<name>/             identities minted here: the tracker's, ``meshnet up``'s nodes
  identity/<name>/                an identity a joining node received (``--join``)
each identity folder holding key.pem, cert.pem and ca.pem.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from meshnet.core.errors import FailedPrecondition
from meshnet.core.ids import new_node_id
from meshnet.security.certificates import (
    NodeCertificate,
    SwarmAuthority,
    create_authority,
    mint_node,
)
from meshnet.security.identity import Role

SWARM_DIR = "swarm"
TRACKER_IDENTITY = "tracker"


def swarm_dir(data_dir: Path) -> Path:
    return data_dir / SWARM_DIR


def book_path(data_dir: Path) -> Path:
    return swarm_dir(data_dir) / "book.sqlite3"


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, data: bytes) -> None:
    # Created 0600 from the start: a key is never readable by others, not even for a moment.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.chmod(path, 0o600)


def is_initialised(data_dir: Path) -> bool:
    return (swarm_dir(data_dir) / "ca.key").exists()


def init_swarm(data_dir: Path, now_unix_s: float, *, name: str | None = None) -> SwarmAuthority:
    """Create the swarm CA and the tracker's identity; refuses to overwrite an existing CA."""
    if is_initialised(data_dir):
        raise FailedPrecondition(f"a swarm already exists in {swarm_dir(data_dir)}; it is never overwritten")
    root = _private_dir(swarm_dir(data_dir))
    authority = create_authority(name or secrets.token_hex(4), now_unix_s)
    _write_private(root / "ca.key", authority.key_pem)
    _write_private(root / "ca.pem", authority.cert_pem)
    mint_identity(data_dir, authority, TRACKER_IDENTITY, node_id="tracker", role="tracker", now_unix_s=now_unix_s)
    return authority


def ensure_swarm(data_dir: Path, now_unix_s: float) -> SwarmAuthority:
    """The swarm in ``data_dir``, created on first use (``meshnet up``)."""
    return load_authority(data_dir) if is_initialised(data_dir) else init_swarm(data_dir, now_unix_s)


def load_authority(data_dir: Path) -> SwarmAuthority:
    root = swarm_dir(data_dir)
    try:
        return SwarmAuthority((root / "ca.pem").read_bytes(), (root / "ca.key").read_bytes())
    except FileNotFoundError:
        raise FailedPrecondition(f"no swarm in {root}: run `meshnet swarm init` first") from None


def mint_identity(
    data_dir: Path, authority: SwarmAuthority, name: str, *, node_id: str, role: Role, now_unix_s: float
) -> NodeCertificate:
    """Mint and store an identity on the CA's own machine (no invite needed: the CA is here)."""
    node = mint_node(authority, node_id=node_id, role=role, now_unix_s=now_unix_s)
    save_identity(_private_dir(swarm_dir(data_dir) / "nodes") / name, node)
    return node


def local_identity(data_dir: Path, name: str, role: Role, now_unix_s: float) -> Path:
    """Mint an identity named ``name`` for a process this machine starts; its folder, for ``--identity``.

    For launchers beside the CA (``meshnet up``, the lab, the bench, test harnesses): no invite
    round trip, since whoever holds the CA could mint any certificate anyway."""
    authority = ensure_swarm(data_dir, now_unix_s)
    mint_identity(data_dir, authority, name, node_id=new_node_id(role), role=role, now_unix_s=now_unix_s)
    return swarm_dir(data_dir) / "nodes" / name


def tracker_identity(data_dir: Path) -> NodeCertificate:
    return load_identity(swarm_dir(data_dir) / "nodes" / TRACKER_IDENTITY)


def joined_identity_dir(data_dir: Path, name: str) -> Path:
    return data_dir / "identity" / name


def save_identity(folder: Path, node: NodeCertificate) -> None:
    _private_dir(folder.parent)
    _private_dir(folder)
    _write_private(folder / "key.pem", node.key_pem)
    _write_private(folder / "cert.pem", node.cert_pem)
    _write_private(folder / "ca.pem", node.ca_pem)


def load_identity(folder: Path) -> NodeCertificate:
    try:
        return NodeCertificate(
            (folder / "key.pem").read_bytes(), (folder / "cert.pem").read_bytes(), (folder / "ca.pem").read_bytes()
        )
    except FileNotFoundError:
        raise FailedPrecondition(f"no node identity in {folder}") from None
