"""``PeerReader`` remembers what a certificate proves, never what time decides or what failed."""

from __future__ import annotations

import time

import pytest

from meshnet.security.certificates import CertificateRefused, PeerReader, create_authority, mint_node, read_peer

NOW = time.time()


def test_a_remembered_certificate_is_still_refused_once_it_expires() -> None:
    authority = create_authority("a", NOW)
    node = mint_node(authority, node_id="n-1", role="worker", now_unix_s=NOW, lifetime_s=60)
    reader = PeerReader()
    assert reader.read(node.cert_pem, authority.cert_pem, NOW + 1) == read_peer(
        node.cert_pem, authority.cert_pem, NOW + 1
    )
    with pytest.raises(CertificateRefused, match="expired"):
        reader.read(node.cert_pem, authority.cert_pem, NOW + 61)


def test_a_certificate_is_checked_against_the_ca_it_is_read_with() -> None:
    """The CA is part of what is remembered: a certificate verified under one CA is not taken
    under another (a swarm whose CA was replaced)."""
    ours, theirs = create_authority("a", NOW), create_authority("b", NOW)
    node = mint_node(theirs, node_id="n-1", role="worker", now_unix_s=NOW)
    reader = PeerReader()
    assert reader.read(node.cert_pem, theirs.cert_pem, NOW).node_id == "n-1"
    with pytest.raises(CertificateRefused, match="not issued by this swarm"):
        reader.read(node.cert_pem, ours.cert_pem, NOW)


def test_a_refused_certificate_is_refused_every_time_and_the_oldest_entries_go_first() -> None:
    ours, theirs = create_authority("a", NOW), create_authority("b", NOW)
    stranger = mint_node(theirs, node_id="x-1", role="worker", now_unix_s=NOW)
    reader = PeerReader(max_entries=2)
    for _ in range(2):
        with pytest.raises(CertificateRefused):
            reader.read(stranger.cert_pem, ours.cert_pem, NOW)
    nodes = [mint_node(ours, node_id=f"n-{index}", role="worker", now_unix_s=NOW) for index in range(3)]
    for node in nodes:
        reader.read(node.cert_pem, ours.cert_pem, NOW)
    assert len(reader._known) == 2
    assert (nodes[0].cert_pem, ours.cert_pem) not in reader._known
