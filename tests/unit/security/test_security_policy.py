"""Authorization verdicts: default deny, roles, and a node speaking only for itself."""

from __future__ import annotations

import pytest

from meshnet.security.identity import PeerIdentity, Role
from meshnet.security.policy import (
    authorize_artifacts,
    authorize_expert,
    authorize_opening,
    authorize_quarantine,
    authorize_relay,
    authorize_shard,
    authorize_tracker,
)


def peer(role: Role, node_id: str = "n-1") -> PeerIdentity:
    return PeerIdentity(node_id, role, 1, 0.0)


NONE: frozenset[str] = frozenset()


@pytest.mark.parametrize(
    ("role", "rpc", "allowed"),
    [
        ("worker", "Register", True),
        ("gateway", "Register", False),
        ("admin", "Register", False),
        ("gateway", "ChooseRoute", True),
        ("worker", "ChooseRoute", False),
        ("gateway", "ReportWork", True),
        ("worker", "ReportWork", False),
        ("admin", "ReportWork", False),
        ("gateway", "ReportRouteTiming", True),
        ("worker", "ReportRouteTiming", False),
        ("admin", "ReportRouteTiming", False),
        ("admin", "Revoke", True),
        ("gateway", "Revoke", False),
        ("worker", "Revoke", False),
        ("gateway", "NoSuchRpc", False),
        ("gateway", "Quarantine", True),
        ("admin", "Quarantine", True),
        ("worker", "Quarantine", False),
        ("admin", "ClearQuarantine", True),
        ("gateway", "ClearQuarantine", False),
        ("worker", "ClearQuarantine", False),
        ("gateway", "ListNodes", True),
        ("admin", "ListNodes", True),
        ("worker", "ListNodes", True),  # the peer that keeps copies of its KV snapshots
        ("tracker", "ListNodes", False),
        ("worker", "Advertise", True),
        ("gateway", "Advertise", False),
        ("admin", "Advertise", False),
        ("worker", "FindHolders", True),
        ("gateway", "FindHolders", True),
        ("admin", "FindHolders", True),
        ("tracker", "FindHolders", False),
        ("worker", "WatchRevocations", True),
        ("gateway", "WatchRevocations", True),
        ("admin", "WatchRevocations", True),
        ("tracker", "WatchRevocations", True),
        ("worker", "ReportSessionTokens", True),
        ("gateway", "ReportSessionTokens", False),
        ("admin", "ReportSessionTokens", False),
    ],
)
def test_tracker_rpcs_by_role(role: Role, rpc: str, allowed: bool) -> None:
    assert authorize_tracker(peer(role), rpc, subject_node_id="n-1", revoked=NONE).allowed is allowed


def test_no_identity_is_unauthenticated() -> None:
    verdict = authorize_tracker(None, "ListModels", subject_node_id=None, revoked=NONE)
    assert (verdict.allowed, verdict.status) == (False, "unauthenticated")


def test_a_revoked_node_is_unauthenticated_everywhere() -> None:
    revoked = frozenset({"n-1"})
    assert authorize_tracker(peer("worker"), "Heartbeat", subject_node_id="n-1", revoked=revoked).status == (
        "unauthenticated"
    )
    assert authorize_shard(peer("gateway"), "Session", session_opener=None, revoked=revoked).status == (
        "unauthenticated"
    )


def test_a_worker_registers_heartbeats_and_deregisters_only_itself() -> None:
    me = peer("worker", "n-1")
    assert authorize_tracker(me, "Register", subject_node_id="n-1", revoked=NONE).allowed
    refused = authorize_tracker(me, "Register", subject_node_id="n-2", revoked=NONE)
    assert (refused.allowed, refused.status) == (False, "permission_denied")
    assert authorize_tracker(me, "Heartbeat", subject_node_id="n-1", revoked=NONE).allowed
    assert not authorize_tracker(me, "Heartbeat", subject_node_id="n-2", revoked=NONE).allowed
    assert not authorize_tracker(me, "Deregister", subject_node_id="n-2", revoked=NONE).allowed
    assert authorize_tracker(peer("admin"), "Deregister", subject_node_id="n-2", revoked=NONE).allowed


def test_only_the_opener_ends_a_session() -> None:
    gateway = peer("gateway", "g-1")
    assert authorize_shard(gateway, "Cancel", session_opener="g-1", revoked=NONE).allowed
    other = authorize_shard(peer("gateway", "g-2"), "Cancel", session_opener="g-1", revoked=NONE)
    assert (other.allowed, other.status) == (False, "permission_denied")
    assert not authorize_shard(peer("worker", "n-9"), "Release", session_opener="g-1", revoked=NONE).allowed


def test_only_workers_copy_snapshots_to_a_peer() -> None:
    """A snapshot holds prompt content: a worker copies its own to a peer; nobody else may."""
    assert authorize_shard(peer("worker", "n-1"), "KeepSnapshot", session_opener=None, revoked=NONE).allowed
    for role in ("gateway", "admin", "tracker"):
        assert not authorize_shard(peer(role), "KeepSnapshot", session_opener=None, revoked=NONE).allowed


def test_a_tracker_certificate_cannot_open_sessions() -> None:
    assert not authorize_shard(peer("tracker", "tracker"), "Session", session_opener=None, revoked=NONE).allowed


def test_a_worker_reports_only_its_own_session_counts() -> None:
    own = authorize_tracker(peer("worker", "w-1"), "ReportSessionTokens", subject_node_id="w-1", revoked=NONE)
    other = authorize_tracker(peer("worker", "w-1"), "ReportSessionTokens", subject_node_id="w-2", revoked=NONE)
    assert own.allowed and (other.allowed, other.status) == (False, "permission_denied")


def test_a_holder_advertises_only_under_its_own_id() -> None:
    assert authorize_tracker(peer("worker", "seed-1"), "Advertise", subject_node_id="seed-1", revoked=NONE).allowed
    other = authorize_tracker(peer("worker", "seed-1"), "Advertise", subject_node_id="seed-2", revoked=NONE)
    assert (other.allowed, other.status) == (False, "permission_denied")


@pytest.mark.parametrize(
    ("role", "allowed"), [("worker", True), ("gateway", True), ("admin", True), ("tracker", False)]
)
def test_artifact_fetch_by_role(role: Role, allowed: bool) -> None:
    assert authorize_artifacts(peer(role), "Fetch", revoked=NONE).allowed is allowed


def test_artifact_fetch_needs_an_identity_and_no_revocation() -> None:
    assert authorize_artifacts(None, "Fetch", revoked=NONE).status == "unauthenticated"
    assert authorize_artifacts(peer("worker"), "Fetch", revoked=frozenset({"n-1"})).status == "unauthenticated"
    assert authorize_artifacts(peer("worker"), "Push", revoked=NONE).status == "permission_denied"


@pytest.mark.parametrize(
    ("role", "rpc", "allowed"),
    [
        ("worker", "ExchangeRows", True),  # a node of the group
        ("gateway", "ExchangeRows", False),  # rows carry hidden states: nodes only
        ("admin", "ExchangeRows", False),
        ("tracker", "ExchangeRows", False),
        ("gateway", "ExpertStep", True),  # the parties that drive generation
        ("worker", "ExpertStep", True),
        ("admin", "ExpertStep", True),
        ("tracker", "ExpertStep", False),
        ("gateway", "ExpertRelease", True),
        ("worker", "ExpertRelease", True),
        ("admin", "ExpertRelease", True),
        ("tracker", "ExpertRelease", False),
        ("gateway", "DescribeExpertNode", True),
        ("admin", "DescribeExpertNode", True),
        ("tracker", "DescribeExpertNode", True),
        ("gateway", "ExpertNoSuchRpc", False),
        ("worker", "Session", False),  # a shard RPC is not an expert RPC
    ],
)
def test_expert_rpcs_by_role(role: Role, rpc: str, allowed: bool) -> None:
    verdict = authorize_expert(peer(role), rpc, revoked=NONE)
    assert (verdict.allowed, verdict.status) == ((True, "ok") if allowed else (False, "permission_denied"))


def test_expert_rpcs_need_an_identity_and_no_revocation() -> None:
    assert authorize_expert(None, "ExpertStep", revoked=NONE).status == "unauthenticated"
    assert authorize_expert(peer("worker"), "ExchangeRows", revoked=frozenset({"n-1"})).status == "unauthenticated"


def test_only_the_listed_node_sends_its_index_rows() -> None:
    listed = authorize_expert(peer("worker", "n-1"), "ExchangeRows", revoked=NONE, listed_node_id="n-1")
    assert listed.allowed
    other = authorize_expert(peer("worker", "n-2"), "ExchangeRows", revoked=NONE, listed_node_id="n-1")
    assert (other.allowed, other.status) == (False, "permission_denied")
    assert authorize_expert(peer("worker", "n-2"), "ExchangeRows", revoked=NONE).allowed  # listed by address only
    # The role is checked first: a gateway stays refused whatever it is listed as.
    assert not authorize_expert(peer("gateway", "n-1"), "ExchangeRows", revoked=NONE, listed_node_id="n-1").allowed


def test_only_parties_serving_users_open_sessions_on_a_head() -> None:
    assert not authorize_opening(peer("worker"), 0).allowed
    assert authorize_opening(peer("worker"), 1).allowed  # its downstream neighbour
    assert authorize_opening(peer("gateway"), 0).allowed and authorize_opening(peer("admin"), 0).allowed
    assert authorize_opening(peer("gateway"), 12).allowed


def test_only_an_admin_quarantines_without_the_audits_evidence() -> None:
    assert authorize_quarantine(peer("admin"), with_evidence=False).allowed
    assert authorize_quarantine(peer("gateway"), with_evidence=True).allowed
    refused = authorize_quarantine(peer("gateway"), with_evidence=False)
    assert (refused.allowed, refused.status) == (False, "permission_denied")


def test_every_member_that_keeps_a_certificate_renews_it_a_relay_too() -> None:
    for role in ("worker", "gateway", "admin", "relay"):
        assert authorize_tracker(peer(role), "Renew", subject_node_id=None, revoked=NONE).allowed, role
    assert not authorize_tracker(peer("tracker"), "Renew", subject_node_id=None, revoked=NONE).allowed


@pytest.mark.parametrize(
    ("role", "rpc", "allowed"),
    [
        ("worker", "Attach", True),
        ("worker", "Splice", True),
        ("gateway", "Attach", False),
        ("relay", "Attach", False),
        ("admin", "Splice", False),
        ("gateway", "Dial", True),
        ("worker", "Dial", True),
        ("relay", "Load", True),
        ("admin", "Load", True),
        ("worker", "RelayNoSuchRpc", False),
    ],
)
def test_relay_rpcs_by_role(role: Role, rpc: str, allowed: bool) -> None:
    verdict = authorize_relay(peer(role), rpc, subject_node_id=None, revoked=NONE)
    assert (verdict.allowed, verdict.status) == ((True, "ok") if allowed else (False, "permission_denied"))


def test_a_node_attaches_and_splices_only_as_itself() -> None:
    for rpc in ("Attach", "Splice"):
        assert authorize_relay(peer("worker", "n-1"), rpc, subject_node_id="n-1", revoked=NONE).allowed
        other = authorize_relay(peer("worker", "n-2"), rpc, subject_node_id="n-1", revoked=NONE)
        assert (other.allowed, other.status) == (False, "permission_denied")
        assert f"may not {rpc.lower()} as node n-1" in other.reason
    # A dialer names any node: the inner mTLS is what the node checks.
    assert authorize_relay(peer("gateway", "g-1"), "Dial", subject_node_id="n-1", revoked=NONE).allowed


def test_relay_rpcs_need_an_identity_and_no_revocation() -> None:
    assert authorize_relay(None, "Dial", subject_node_id=None, revoked=NONE).status == "unauthenticated"
    revoked = authorize_relay(peer("worker", "n-1"), "Attach", subject_node_id="n-1", revoked=frozenset({"n-1"}))
    assert revoked.status == "unauthenticated"
