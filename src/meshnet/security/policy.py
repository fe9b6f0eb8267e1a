"""Who may call what: pure verdicts over a peer's identity, the RPC and what it touches.

Default deny: an RPC not named here is refused for everyone. The servers ask these functions
and answer a refusal with UNAUTHENTICATED (no usable identity) or PERMISSION_DENIED (known peer,
wrong role or someone else's object); nothing here does I/O, so every rule has a unit test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from meshnet.security.identity import ROLES, PeerIdentity, Role

TrackerRpc = Literal[
    "Register",
    "Heartbeat",
    "Deregister",
    "ChooseRoute",
    "ReportWork",
    "ReportRouteTiming",
    "ListModels",
    "Revoke",
    "Renew",
    "Quarantine",
    "ClearQuarantine",
    "ListQuarantine",
    "ListNodes",
    "Advertise",
    "FindHolders",
    "SuggestLayers",
    "WatchRevocations",
    "ReportSessionTokens",
]
ShardRpc = Literal[
    "Session",
    "Cancel",
    "Release",
    "GetCapability",
    "GetMetrics",
    "RingReturn",
    "HeldKv",
    "HeldSnapshots",
    "KeepSnapshot",
]
ArtifactRpc = Literal["Fetch"]
ExpertRpc = Literal["ExchangeRows", "ExpertStep", "ExpertRelease", "DescribeExpertNode"]
RelayRpc = Literal["Attach", "Splice", "Dial", "Load"]

_TRACKER_ROLES: dict[str, frozenset[Role]] = {
    # A node's own membership: only workers, and only for themselves (see ``authorize_tracker``).
    "Register": frozenset({"worker"}),
    "Heartbeat": frozenset({"worker"}),
    "Deregister": frozenset({"worker", "admin"}),
    # Routing and billing: only the parties that serve users.
    "ChooseRoute": frozenset({"gateway", "admin"}),
    "ReportWork": frozenset({"gateway"}),
    # Node speeds are measured by the party that drives routes, never reported by the nodes.
    "ReportRouteTiming": frozenset({"gateway"}),
    "ListModels": frozenset({"gateway", "admin", "worker"}),
    "Revoke": frozenset({"admin"}),
    "SuggestLayers": frozenset({"worker", "admin"}),
    # Every member that keeps a certificate up renews it at half life (a relay too: ``meshnet relay``).
    "Renew": frozenset({"worker", "gateway", "admin", "relay"}),
    # The audit's verdict: the gateway that caught a node may quarantine it, with the evidence
    # (``authorize_quarantine``); only a person lifts it.
    "Quarantine": frozenset({"gateway", "admin"}),
    "ClearQuarantine": frozenset({"admin"}),
    "ListQuarantine": frozenset({"gateway", "admin"}),
    # The node table names every node's address and load: for the operators' views, and for a
    # worker finding the peer of its own recipe and layers that keeps copies of its KV snapshots.
    "ListNodes": frozenset({"gateway", "admin", "worker"}),
    # Artifact directory: holders (workers, seeders joined as workers) announce themselves only.
    "Advertise": frozenset({"worker"}),
    "FindHolders": frozenset({"worker", "gateway", "admin"}),
    # Every member refuses revoked peers, so every member may follow the list (an expert node,
    # which does not register, watches it too).
    "WatchRevocations": frozenset(ROLES),
    # What a shard computed, the check on gateways' work records: a worker counts only its own.
    "ReportSessionTokens": frozenset({"worker"}),
}
_SHARD_ROLES: dict[str, frozenset[Role]] = {
    # Workers open sessions on their downstream neighbour; gateways on the head.
    "Session": frozenset({"gateway", "worker", "admin"}),
    "RingReturn": frozenset({"worker"}),
    # Ring frames of many sessions at once: only a forwarding worker sends them.
    "RingBatch": frozenset({"worker"}),
    # Whether a prefix is held: asked by whoever opens sessions, before it opens one.
    "HeldKv": frozenset({"gateway", "worker", "admin"}),
    # Which snapshots of a session are held: asked by whoever fails a session over.
    "HeldSnapshots": frozenset({"gateway", "worker", "admin"}),
    # A snapshot holds prompt content: only a worker of the swarm copies one to a peer.
    "KeepSnapshot": frozenset({"worker"}),
    "Cancel": frozenset({"gateway", "worker", "admin"}),
    "Release": frozenset({"gateway", "worker", "admin"}),
    "GetCapability": frozenset({"gateway", "worker", "admin", "tracker"}),
    "GetMetrics": frozenset({"gateway", "worker", "admin", "tracker"}),
}
_ARTIFACT_ROLES: dict[str, frozenset[Role]] = {
    # Model bytes go to the swarm's members only: fetching workers, and operators checking a holder.
    "Fetch": frozenset({"worker", "gateway", "admin"}),
}
_EXPERT_ROLES: dict[str, frozenset[Role]] = {
    # Slot rows carry every token's hidden state: only the group's own nodes swap them.
    "ExchangeRows": frozenset({"worker"}),
    # Steps and releases drive generation: the parties that may open a shard Session.
    "ExpertStep": frozenset({"gateway", "worker", "admin"}),
    "ExpertRelease": frozenset({"gateway", "worker", "admin"}),
    "DescribeExpertNode": frozenset({"gateway", "worker", "admin", "tracker"}),
}
_RELAY_ROLES: dict[str, frozenset[Role]] = {
    # Only a worker is reached through a relay, and only as itself (``authorize_relay``).
    "Attach": frozenset({"worker"}),
    "Splice": frozenset({"worker"}),
    # Any swarm member may dial an attached node (the inner mTLS decides what it may do there),
    # and ask the relay's load.
    "Dial": frozenset(ROLES),
    "Load": frozenset(ROLES),
}


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    status: Literal["ok", "unauthenticated", "permission_denied"]
    reason: str


ALLOW = Verdict(True, "ok", "")


def _deny(reason: str) -> Verdict:
    return Verdict(False, "permission_denied", reason)


def _by_role(
    peer: PeerIdentity | None, rpc: str, roles: dict[str, frozenset[Role]], revoked: frozenset[str]
) -> tuple[PeerIdentity | None, Verdict]:
    """The identity-and-role half every verdict shares: (the peer if it passed, the verdict so far)."""
    if peer is None:
        return None, Verdict(False, "unauthenticated", "a swarm certificate is required")
    if peer.node_id in revoked:
        return None, Verdict(False, "unauthenticated", f"node {peer.node_id} is revoked")
    allowed = roles.get(rpc)
    if allowed is None or peer.role not in allowed:
        return None, _deny(f"a {peer.role} certificate may not call {rpc}")
    return peer, ALLOW


def authorize_tracker(
    peer: PeerIdentity | None, rpc: str, *, subject_node_id: str | None, revoked: frozenset[str]
) -> Verdict:
    """May ``peer`` call the tracker's ``rpc`` about ``subject_node_id`` (the node a membership call names)?"""
    caller, verdict = _by_role(peer, rpc, _TRACKER_ROLES, revoked)
    if caller is None:
        return verdict
    # Membership is bound to the certificate: a node registers under its own node id and speaks
    # only for itself (admins may evict).
    if rpc in ("Register", "Heartbeat", "Deregister") and caller.role != "admin" and subject_node_id != caller.node_id:
        return _deny(f"node {caller.node_id} may not {rpc.lower()} node {subject_node_id}")
    # A holder announces only what it holds itself, under its certificate's node id.
    if rpc == "Advertise" and subject_node_id != caller.node_id:
        return _deny(f"node {caller.node_id} may not advertise as holder {subject_node_id}")
    # A worker counts only the work it did itself.
    if rpc == "ReportSessionTokens" and subject_node_id != caller.node_id:
        return _deny(f"node {caller.node_id} may not report tokens as node {subject_node_id}")
    return ALLOW


def authorize_quarantine(peer: PeerIdentity, *, with_evidence: bool) -> Verdict:
    """May ``peer`` (already admitted to ``Quarantine``) quarantine a node, with or without evidence?

    A gateway speaks for its auditor, whose order carries the runs that isolate the node (the
    tracker checks them); an order with none is an accusation, and only a person (admin) may
    take a node out on their own word."""
    if peer.role == "admin" or with_evidence:
        return ALLOW
    return _deny(f"a {peer.role} certificate quarantines a node only with the audit's evidence")


def authorize_artifacts(peer: PeerIdentity | None, rpc: str, *, revoked: frozenset[str]) -> Verdict:
    """May ``peer`` call a holder's Artifacts ``rpc`` (a worker's or a seeder's server)?"""
    return _by_role(peer, rpc, _ARTIFACT_ROLES, revoked)[1]


def authorize_expert(
    peer: PeerIdentity | None, rpc: str, *, revoked: frozenset[str], listed_node_id: str | None = None
) -> Verdict:
    """May ``peer`` call an expert-parallel node's ``rpc``? ``listed_node_id``: for ExchangeRows,
    the node id the group lists for the index the stream claims (None when listed by address only).

    No per-slot owner check, unlike a shard's Cancel/Release: a group runs one step sequence,
    which the nodes keep in order whoever drives it (a second driver continues a group)."""
    caller, verdict = _by_role(peer, rpc, _EXPERT_ROLES, revoked)
    if caller is None:
        return verdict
    # One node cannot stand in for another: the listed node's certificate, and only it, sends its rows.
    if rpc == "ExchangeRows" and listed_node_id is not None and caller.node_id != listed_node_id:
        return _deny(f"node {caller.node_id} may not send the rows of group member {listed_node_id}")
    return ALLOW


def authorize_shard(
    peer: PeerIdentity | None, rpc: str, *, session_opener: str | None, revoked: frozenset[str]
) -> Verdict:
    """May ``peer`` call a worker's ``rpc``? ``session_opener``: who opened the session it names, if known."""
    caller, verdict = _by_role(peer, rpc, _SHARD_ROLES, revoked)
    if caller is None:
        return verdict
    if rpc in ("Cancel", "Release") and session_opener is not None and session_opener != caller.node_id:
        return _deny(f"only the party that opened the session may {rpc.lower()} it")
    return ALLOW


def authorize_relay(
    peer: PeerIdentity | None, rpc: str, *, subject_node_id: str | None, revoked: frozenset[str]
) -> Verdict:
    """May ``peer`` call a relay's ``rpc``? ``subject_node_id``: the node an Attach or a Splice
    is for (the hello's node id, the node the connection was dialled to); None before it is read."""
    caller, verdict = _by_role(peer, rpc, _RELAY_ROLES, revoked)
    if caller is None:
        return verdict
    # A node is reached only through its own link: no certificate attaches, or takes the
    # connections dialled to, another node.
    if rpc in ("Attach", "Splice") and subject_node_id is not None and subject_node_id != caller.node_id:
        return _deny(f"a certificate of node {caller.node_id} may not {rpc.lower()} as node {subject_node_id}")
    return ALLOW


def authorize_opening(peer: PeerIdentity, first_layer: int) -> Verdict:
    """May ``peer`` open a session whose first frame asks for layers from ``first_layer`` on?

    A worker opens sessions only on its downstream neighbour, whose layers start past 0; a
    route's head takes token ids only from the parties that serve users (gateways, admins), so a
    worker certificate cannot drive generation on another node's head."""
    if peer.role == "worker" and first_layer == 0:
        return _deny("a worker opens sessions only on its downstream neighbour, never on a route's head (layer 0)")
    return ALLOW


class Revocations:
    """The revoked node ids a server refuses, replaced whole when the tracker sends a newer list.

    One object per process, passed to every server and pool that checks peers (no global)."""

    def __init__(self, revoked: frozenset[str] = frozenset()) -> None:
        self._revoked = revoked

    def current(self) -> frozenset[str]:
        return self._revoked

    def replace(self, revoked: frozenset[str]) -> None:
        self._revoked = revoked
