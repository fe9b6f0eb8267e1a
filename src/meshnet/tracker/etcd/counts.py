"""Shards' token counts shared between tracker replicas through etcd.

A shard reports what it computed for each session (``ReportSessionTokens``) to the replica it
heartbeats; the record of that session may reach another replica, the one that routed it, which
judges it against those counts (``tracker.work_checks``). So each replica writes the counts it
receives under ``counts/<replica>/<n>`` (one key per report, under a lease of its own that lets
them lapse within ``COUNTS_TTL_S``), and every replica reads the others' new ones at each
membership exchange. A record judged before its counts arrived is stored disputed and settled
when they do, as with any shard reporting late.
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets
import time
from collections.abc import Callable

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId, SessionId, check_node_id
from meshnet.core.tracking import SessionTokens
from meshnet.tracker.etcd.client import EtcdClient, EtcdRefused
from meshnet.tracker.etcd.store import KEY_PREFIX

logger = logging.getLogger(__name__)

COUNTS_PREFIX = KEY_PREFIX + "counts/"
COUNTS_TTL_S = 1200
"""Counts stay at least half of this: longer than a request's record takes to arrive (a
gateway's outbox retries for minutes)."""

Counts = tuple[NodeId, tuple[SessionTokens, ...]]


def encode_counts(node_id: NodeId, sessions: tuple[SessionTokens, ...]) -> bytes:
    rows = [[item.session_id, item.route_epoch, item.positions, item.prompt_tokens] for item in sessions]
    return json.dumps({"node": node_id, "sessions": rows}).encode()


def decode_counts(value: bytes) -> Counts:
    """A stored report (validated by ``SessionTokens`` itself); InvalidArgument if it is not one."""
    try:
        data = json.loads(value)
        sessions = tuple(
            SessionTokens(SessionId(session), int(epoch), int(positions), int(prompt))
            for session, epoch, positions, prompt in data["sessions"]
        )
        return check_node_id(data["node"]), sessions
    except (ValueError, TypeError, KeyError) as error:
        raise InvalidArgument(f"shard counts in etcd are malformed: {error}") from None


class SharedCounts:
    """One replica's side: publish what its shards report, read what the others' did. Blocking
    calls (run them off the event loop)."""

    def __init__(self, client: EtcdClient, replica_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        # A token per process: a restarted replica's keys do not overwrite its predecessor's.
        self._mine = COUNTS_PREFIX + replica_id + "/"
        self._keys = f"{self._mine}{secrets.token_hex(4)}-"
        self._sequence = itertools.count()
        self._clock = clock
        self._lease = 0
        self._lease_granted = 0.0
        self._read_through = 0
        """The etcd revision up to which the others' counts were read."""

    def publish(self, node_id: NodeId, sessions: tuple[SessionTokens, ...]) -> None:
        # A new lease every half TTL: each key lives between a half and a whole TTL.
        now = self._clock()
        if not self._lease or now - self._lease_granted > COUNTS_TTL_S / 2:
            self._lease, self._lease_granted = self._client.grant_lease(COUNTS_TTL_S), now
        key, value = f"{self._keys}{next(self._sequence):012d}", encode_counts(node_id, sessions)
        try:
            self._client.put(key, value, self._lease)
        except EtcdRefused:  # the lease is gone (etcd lost it, or it lapsed): a new one at once
            self._lease, self._lease_granted = self._client.grant_lease(COUNTS_TTL_S), now
            self._client.put(key, value, self._lease)

    def others_since_last(self) -> tuple[list[Counts], int]:
        """The counts other replicas published since the last ``read_through``, and the revision
        to pass it once every one was taken (until then they are read again: none is lost to an
        exchange that failed after reading them)."""
        found = self._client.get_prefix(COUNTS_PREFIX, after_revision=self._read_through)
        if not found:
            return [], self._read_through
        through = max(kv.mod_revision for kv in found)
        counts = []
        for kv in found:
            if kv.key.startswith(self._mine):
                continue
            try:
                counts.append(decode_counts(kv.value))
            except InvalidArgument as error:
                logger.warning("%s: %s", kv.key, error.message)
        return counts, through

    def read_through(self, revision: int) -> None:
        """Every count up to ``revision`` was taken: the next read starts after it."""
        self._read_through = max(self._read_through, revision)
