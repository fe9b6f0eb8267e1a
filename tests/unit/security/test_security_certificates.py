"""The swarm CA's certificates: what they name, and every way a bad one is refused."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from meshnet.core.errors import FailedPrecondition, InvalidArgument
from meshnet.security.certificates import (
    CertificateRefused,
    ca_fingerprint,
    create_authority,
    mint_node,
    new_key_and_csr,
    read_peer,
    sign_csr,
)
from meshnet.security.swarm_dir import init_swarm, load_authority, local_identity, swarm_dir

NOW = time.time()


def test_a_signed_csr_names_the_node_and_role_the_ca_chose() -> None:
    authority = create_authority("t", NOW)
    _key, csr = new_key_and_csr()
    cert = sign_csr(authority, csr, node_id="n-1", role="gateway", now_unix_s=NOW)
    peer = read_peer(cert, authority.cert_pem, NOW + 1)
    assert (peer.node_id, peer.role) == ("n-1", "gateway")


def test_a_certificate_of_another_ca_is_refused() -> None:
    ours, theirs = create_authority("a", NOW), create_authority("b", NOW)
    node = mint_node(theirs, node_id="n-1", role="worker", now_unix_s=NOW)
    with pytest.raises(CertificateRefused, match="not issued by this swarm"):
        read_peer(node.cert_pem, ours.cert_pem, NOW)


def test_an_expired_certificate_is_refused() -> None:
    authority = create_authority("a", NOW)
    node = mint_node(authority, node_id="n-1", role="worker", now_unix_s=NOW, lifetime_s=60)
    read_peer(node.cert_pem, authority.cert_pem, NOW + 59)
    with pytest.raises(CertificateRefused, match="expired"):
        read_peer(node.cert_pem, authority.cert_pem, NOW + 61)


def test_a_csr_whose_signature_does_not_match_is_refused() -> None:
    authority = create_authority("a", NOW)
    _key, csr = new_key_and_csr()
    # Flip one byte of the base64 body near the signature: still PEM, no longer self-consistent.
    body = bytearray(csr)
    index = body.rindex(b"\n-----END") - 8
    body[index] = ord("A") if body[index] != ord("A") else ord("B")
    with pytest.raises(CertificateRefused):
        sign_csr(authority, bytes(body), node_id="n-1", role="worker", now_unix_s=NOW)


@pytest.mark.parametrize("node_id", ["", "UPPER", "has space", "x" * 64, "-lead"])
def test_node_ids_must_be_one_dns_label(node_id: str) -> None:
    authority = create_authority("a", NOW)
    with pytest.raises(InvalidArgument):
        mint_node(authority, node_id=node_id, role="worker", now_unix_s=NOW)


def test_swarm_init_writes_private_files_once(tmp_path: Path) -> None:
    authority = init_swarm(tmp_path, NOW)
    root = swarm_dir(tmp_path)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for path in root.rglob("*"):
        expected = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.stat().st_mode) == expected, path
    assert load_authority(tmp_path).fingerprint == authority.fingerprint == ca_fingerprint(authority.cert_pem)
    with pytest.raises(FailedPrecondition, match="never overwritten"):
        init_swarm(tmp_path, NOW)


def test_local_identities_get_distinct_node_ids(tmp_path: Path) -> None:
    first = local_identity(tmp_path, "a", "worker", NOW)
    second = local_identity(tmp_path, "b", "worker", NOW)
    authority = load_authority(tmp_path)
    ids = {read_peer((folder / "cert.pem").read_bytes(), authority.cert_pem, NOW).node_id for folder in (first, second)}
    assert len(ids) == 2
