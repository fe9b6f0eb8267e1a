"""Which of a swarm's tracker replicas a client asks, and which of its calls may be asked twice.

A client is given its trackers as an ordered list (``--tracker a:7070,b:7070,c:7070``). It sticks
to the replica that answers: moving on a whim would spread one node's calls over every replica
for nothing. A transport failure (the replica cannot be reached, is too slow, or ended the call
as it stopped) moves it to the next one in the list, wrapping around, so the first replica that
still answers is found in at most one call per lost replica.

A call lost with its replica may have reached it or not; asking again on the next replica is
safe only where a second delivery changes nothing, ``RETRIED_ON_NEXT_REPLICA`` says for which
calls and why. The others are not repeated by the client: their caller's own loop asks again
(the next report, the next renewal) or drops them.
"""

from __future__ import annotations

from meshnet.core.addresses import parse_address_list
from meshnet.core.errors import DeadlineExceeded, Unreachable

REPLICA_LOST = (Unreachable, DeadlineExceeded)
"""What moves a client to the next replica: the replica is unreachable, stopped mid-call (a
CANCELLED the caller did not ask for is rebuilt as ``Unreachable`` by
``wire.status.error_from_rpc``), or too slow. An answer (even an error such as ``NoRoute`` or
``TrackerBusy``) is the replica doing its work: the client stays."""

RETRIED_ON_NEXT_REPLICA: dict[str, str] = {
    "Register": "an upsert keyed by the node's id: a second one leaves the same record",
    "Heartbeat": "refreshes the node's liveness and load; twice is as once",
    "Deregister": "removing a node twice removes it once",
    "SuggestLayers": "a read",
    "ChooseRoute": "routes of a session are keyed by its session and request ids; a second route "
    "for them replaces the first, which was never used",
    "ReportWork": "stored once per request id",
    "ListModels": "a read",
    "ListQuarantine": "a read",
    "ListNodes": "a read",
    "FindHolders": "a read",
    "Advertise": "an announcement keyed by the holder's address, refreshed in place",
    "Renew": "a certificate for the same key and id; the one not received is never presented",
    "Revoke": "revoking an id twice revokes it once (the second reply says it was not new)",
    "Quarantine": "a verdict on a node id; a second one finds it already applied",
}
"""Calls asked once more, on the next replica, when theirs was lost mid-call, with why that is
safe. Not here: ``ReportSessionTokens`` (counted as it arrives, so the client does not add a
second delivery of its own; the worker keeps a batch that failed and sends it again after its
backoff, by then to the replica the client moved to) and
``ReportRouteTiming`` (a second copy would weigh one measurement twice; losing one is harmless)."""


class ReplicaRing:
    """The ordered replicas of one tracker and the one a client asks now."""

    def __init__(self, addresses: str) -> None:
        self.addresses = parse_address_list(addresses)
        self._current = 0

    @property
    def current(self) -> int:
        """The index of the replica asked now: the last one that answered, or the first."""
        return self._current

    def lost(self, index: int) -> int:
        """Replica ``index`` failed a call: move to the next one (unless another call already
        moved on from it) and return the index to ask now."""
        if index == self._current:
            self._current = (index + 1) % len(self.addresses)
        return self._current

    def __len__(self) -> int:
        return len(self.addresses)
