"""Invites: tokens, uses counted across restarts, expiry, forgery; fuzzed join messages."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshnet.core.errors import InvalidArgument, MeshnetError
from meshnet.security.certificates import create_authority, sign_csr
from meshnet.security.invites import InviteRefused, JoinToken, SwarmBook, parse_token
from meshnet.wire import services
from meshnet.wire.swarm_wire import join_from_proto

NOW = time.time()


def test_a_token_round_trips() -> None:
    token = JoinToken("a" * 64, "s" * 32, "10.0.0.1:7071")
    assert parse_token(str(token)) == token


@pytest.mark.parametrize(
    "text",
    [
        "",
        "meshnet-join:",
        "meshnet-join:" + "a" * 63 + ":" + "s" * 32 + "@h:1",
        "meshnet-join:" + "a" * 64 + ":short@h:1",
    ],
)
def test_malformed_tokens_are_invalid_arguments(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_token(text)


def test_uses_are_counted_and_survive_reopening(tmp_path: Path) -> None:
    book = SwarmBook(tmp_path / "book.sqlite3")
    secret = book.create_invite("worker", expires_at_unix_s=NOW + 60, max_uses=2)
    assert book.redeem(secret, NOW) == "worker"
    book.close()
    book = SwarmBook(tmp_path / "book.sqlite3")
    assert book.redeem(secret, NOW) == "worker"
    with pytest.raises(InviteRefused, match="already used 2 of 2"):
        book.redeem(secret, NOW)


def test_expired_and_unknown_invites_are_refused(tmp_path: Path) -> None:
    book = SwarmBook(tmp_path / "book.sqlite3")
    secret = book.create_invite("gateway", expires_at_unix_s=NOW + 60, max_uses=5)
    with pytest.raises(InviteRefused, match="expired"):
        book.redeem(secret, NOW + 61)
    with pytest.raises(InviteRefused, match="unknown"):
        book.redeem("forged-secret-of-some-length", NOW)


def test_invites_never_grant_the_tracker_role(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        SwarmBook(tmp_path / "book.sqlite3").create_invite("tracker", expires_at_unix_s=NOW + 60, max_uses=1)


AUTHORITY = create_authority("fuzz", NOW)


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=st.text(max_size=200), csr=st.binary(max_size=2048))
def test_fuzzed_join_messages_end_in_typed_errors(secret: str, csr: bytes) -> None:
    """Whatever arrives as a Join: a typed error, never a crash (join decoding, then CSR signing)."""
    message = services.SwarmJoinRequest(invite_secret=secret, csr_pem=csr)
    wire = services.SwarmJoinRequest.FromString(message.SerializeToString())
    try:
        _secret, csr_pem = join_from_proto(wire)
        sign_csr(AUTHORITY, csr_pem, node_id="n-1", role="worker", now_unix_s=NOW)
    except MeshnetError:
        return
    pytest.fail("random bytes were accepted as a CSR")


PEM_HEAD = b"-----BEGIN CERTIFICATE REQUEST-----\n"
PEM_TAIL = b"\n-----END CERTIFICATE REQUEST-----\n"


@settings(max_examples=1000, deadline=None)
@given(body=st.binary(max_size=600))
def test_fuzzed_pem_shaped_csrs_end_in_typed_errors(body: bytes) -> None:
    """CSR-shaped input (PEM armour around random base64) reaches the DER parser: still typed."""
    import base64

    pem = PEM_HEAD + base64.encodebytes(body) + PEM_TAIL
    with pytest.raises(MeshnetError):
        sign_csr(AUTHORITY, pem, node_id="n-1", role="worker", now_unix_s=NOW)
