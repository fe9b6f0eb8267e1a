"""``TrackerStore`` in etcd: what several tracker replicas of one swarm share durably.

Why etcd (3.4, Debian's ``etcd-server``): a 3-member cluster keeps its quorum when any one
member dies, with no failover manager to run (PostgreSQL would need one), every write is
raft-replicated and fsynced on a majority before it is acknowledged (what work records, which
contributors are paid from, need), and leases and prefix reads let replicas follow each other's
membership (``tracker.etcd.membership``). Figures: ``bench/results/tracker_scale/etcd_store.json``.

Keys, under one prefix per swarm (``meshnet/``):

- ``epoch``: the largest epoch any replica handed out; written by compare-and-swap to the max,
  so it never goes down, whichever replica writes.
- ``work/<request_id>``: a work record with its content digest, created in a transaction only
  if absent: the same record reported again (to any replica) is stored once, another under its
  id is refused (FailedPrecondition), exactly as ``SqliteTrackerStore`` does, for as long as
  the record is kept: under a lease that expires after ``--work-retention``
  (``tracker.etcd.retention``), so etcd deletes it itself.
- ``dispute/<request_id>``: why a record is not stored as reported (written with it, under its lease).
- ``quarantine/<node_id>``: a quarantine with its evidence; replicas apply each other's.
- ``seen/<node_id>``: nodes that ever registered (history, as the SQLite ``nodes`` table).

Live membership, shards' token counts and revocations are shared by the replicas' exchange
(``tracker.etcd.membership``, ``counts``, ``revocations``). The swarm CA, from which each replica
mints the certificate it signs route tickets with, is shared as files: every replica runs on a
copy of the same swarm data dir.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

from meshnet.core.audit_evidence import QuarantineEntry, QuarantineEvidence, evidence_from_json, evidence_to_json
from meshnet.core.errors import FailedPrecondition, InvalidArgument, StorageDamaged, StorageUnavailable
from meshnet.core.ids import NodeId, RequestId
from meshnet.core.node_record import NodeRecord
from meshnet.core.tracking import WorkRecord, WorkStatus
from meshnet.route.outbox import record_from_json, record_to_json
from meshnet.tracker.etcd.client import Delete, EtcdClient, KeyValue, LeaseNotFound, Operation, Put
from meshnet.tracker.etcd.retention import BucketLeases, RetentionPolicy
from meshnet.tracker.store import work_fingerprint

logger = logging.getLogger(__name__)

KEY_PREFIX = "meshnet/"
EPOCH_KEY = KEY_PREFIX + "epoch"
WORK_PREFIX = KEY_PREFIX + "work/"
DISPUTE_PREFIX = KEY_PREFIX + "dispute/"
QUARANTINE_PREFIX = KEY_PREFIX + "quarantine/"
SEEN_PREFIX = KEY_PREFIX + "seen/"

WORK_PAGE = 500
"""Work records per range read when listing them (~0.5 kB each stored): a reply of ~0.3 MB,
however many records the store holds."""
MAX_CAS_ATTEMPTS = 64
"""Read-modify-write loops give up (StorageUnavailable: retry) past this many lost races."""


def decode_int(kv: KeyValue) -> int:
    """A stored integer (the epoch); StorageDamaged naming the key if it is not one."""
    text = kv.value.decode("ascii", errors="replace")
    if not text.isdigit():
        raise StorageDamaged(f"etcd key {kv.key} holds {text[:40]!r}, not a non-negative integer")
    return int(text)


def decode_object(kv: KeyValue, *fields: str) -> dict[str, Any]:
    """A stored JSON object with ``fields``; StorageDamaged naming the key if it is not one
    (whoever wrote it): every value read back from etcd goes through here or ``decode_int``."""
    try:
        data = json.loads(kv.value)
    except ValueError as error:
        raise StorageDamaged(f"etcd key {kv.key} does not hold JSON: {error}") from None
    if not isinstance(data, dict):
        raise StorageDamaged(f"etcd key {kv.key} holds {type(data).__name__}, not a JSON object")
    missing = [name for name in fields if name not in data]
    if missing:
        raise StorageDamaged(f"etcd key {kv.key} lacks {', '.join(missing)}")
    return data


def decode_work(kv: KeyValue) -> tuple[dict[str, Any], WorkRecord]:
    """A stored work record's fields and record; StorageDamaged naming the key if malformed."""
    data = decode_object(kv, "record", "sha256")
    try:
        return data, record_from_json(data["record"])
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise StorageDamaged(f"etcd key {kv.key} holds a malformed work record: {error!r}") from None
    except InvalidArgument as error:
        raise StorageDamaged(f"etcd key {kv.key} holds an invalid work record: {error.message}") from None


class EtcdTrackerStore:
    """``TrackerStore`` over an etcd cluster; every call raises ``StorageUnavailable`` when no
    member answers. Several tracker replicas may use one cluster at once."""

    def __init__(
        self, client: EtcdClient, work_page: int = WORK_PAGE, retention: RetentionPolicy | None = None
    ) -> None:
        self.client = client
        self.work_page = work_page
        self.leases = BucketLeases(retention or RetentionPolicy(), client.grant_lease)

    def load_epoch(self) -> int:
        stored = self.client.get(EPOCH_KEY)
        return 0 if stored is None else decode_int(stored)

    def save_epoch(self, epoch: int) -> None:
        for _ in range(MAX_CAS_ATTEMPTS):
            stored = self.client.get(EPOCH_KEY)
            if stored is not None and decode_int(stored) >= epoch:
                return
            revision = 0 if stored is None else stored.mod_revision
            if self.client.commit_if([(EPOCH_KEY, revision)], [Put(EPOCH_KEY, str(epoch).encode())]):
                return
        raise StorageUnavailable(f"the epoch could not be raised to {epoch}: other replicas kept changing it; retry")

    def record_node(self, node_id: NodeId, record: NodeRecord, seen_at: float) -> None:
        # History only (what ``node_seen`` answers); the live membership is tracker.etcd.membership's.
        self.client.put(SEEN_PREFIX + node_id, json.dumps({"address": record.address, "seen_at": seen_at}).encode())

    def node_seen(self, node_id: NodeId) -> bool:
        return self.client.get(SEEN_PREFIX + node_id) is not None

    def record_work(self, record: WorkRecord, recorded_at: float) -> bool:
        return self.record_judged_work(record, record, "", recorded_at)

    def record_judged_work(self, reported: WorkRecord, judged: WorkRecord, reason: str, recorded_at: float) -> bool:
        digest = work_fingerprint(reported)
        value = json.dumps({"record": record_to_json(judged), "sha256": digest, "recorded_at": recorded_at}).encode()
        stored = self._create_leased(WORK_PREFIX + reported.request_id, value, reason)
        if stored is None:
            return True
        if decode_object(stored, "sha256")["sha256"] != digest:
            raise FailedPrecondition(
                f"work record {reported.request_id} was stored with other content: "
                "a request is reported once (a new request needs a new id)"
            )
        return False

    def _create_leased(self, key: str, value: bytes, dispute: str) -> KeyValue | None:
        """``client.create`` of a record (and its ``dispute``, if any) under this bucket's lease;
        once more under a new lease if etcd no longer has the one held."""
        lease = self.leases.lease_now()
        try:
            return self.client.create(key, value, self._dispute_put(key, dispute, lease), lease=lease)
        except LeaseNotFound:
            self.leases.forget(lease)
        lease = self.leases.lease_now()
        return self.client.create(key, value, self._dispute_put(key, dispute, lease), lease=lease)

    @staticmethod
    def _dispute_put(key: str, dispute: str, lease: int) -> list[Operation]:
        return [Put(DISPUTE_PREFIX + key.removeprefix(WORK_PREFIX), dispute.encode(), lease)] if dispute else []

    def settle_work(self, request_id: RequestId, status: WorkStatus) -> None:
        self._update_work(request_id, status, [Delete(DISPUTE_PREFIX + request_id)])

    def work_dispute(self, request_id: RequestId) -> str | None:
        stored = self.client.get(DISPUTE_PREFIX + request_id)
        return None if stored is None else stored.value.decode(errors="replace")

    def get_work(self, request_id: RequestId) -> WorkRecord | None:
        stored = self.client.get(WORK_PREFIX + request_id)
        return None if stored is None else decode_work(stored)[1]

    def list_work(self) -> list[WorkRecord]:
        """Every stored record, in the order they were stored (etcd's create revision), read
        ``work_page`` at a time; a malformed one is left out (logged), not fatal to the rest."""
        stored: list[tuple[int, WorkRecord]] = []
        for page in self.client.get_prefix_pages(WORK_PREFIX, self.work_page):
            for kv in page:
                try:
                    stored.append((kv.create_revision, decode_work(kv)[1]))
                except StorageDamaged as error:
                    logger.warning("%s", error.message)
        return [record for _, record in sorted(stored, key=lambda item: item[0])]

    def quarantine_node(
        self,
        node_id: NodeId,
        reason: str,
        request_id: RequestId | None,
        at: float,
        evidence: QuarantineEvidence | None = None,
    ) -> bool:
        entry = {
            "reason": reason,
            "request_id": request_id,
            "since": at,
            "evidence": None if evidence is None else evidence_to_json(evidence),
        }
        quarantine = Put(QUARANTINE_PREFIX + node_id, json.dumps(entry).encode())
        if request_id is None:
            self.client.write([quarantine])
            return False
        # Only the status changes: the digest stays, so a retried report is still a duplicate.
        # One transaction with the quarantine: a replica never sees one without the other.
        return self._update_work(request_id, "unverified", [quarantine])

    def clear_quarantine(self, node_id: NodeId) -> None:
        self.client.delete(QUARANTINE_PREFIX + node_id)

    def quarantined_nodes(self) -> tuple[NodeId, ...]:
        return tuple(entry.node_id for entry in self.quarantine_entries())

    def quarantine_entries(self) -> tuple[QuarantineEntry, ...]:
        entries = []
        for kv in self.client.get_prefix(QUARANTINE_PREFIX):
            try:
                entries.append(quarantine_from_kv(kv))
            except StorageDamaged as error:  # the node stays quarantined (its key exists)
                logger.warning("%s", error.message)
                entries.append(
                    QuarantineEntry(NodeId(kv.key.removeprefix(QUARANTINE_PREFIX)), "unreadable", None, 0.0, None)
                )
        return tuple(sorted(entries, key=lambda entry: entry.since))

    def close(self) -> None:
        self.client.close()

    def _update_work(self, request_id: RequestId, status: WorkStatus, also: list[Operation]) -> bool:
        """Set a stored record's status (and apply ``also``) by compare-and-swap; False if absent."""
        key = WORK_PREFIX + request_id
        for _ in range(MAX_CAS_ATTEMPTS):
            stored = self.client.get(key)
            if stored is None:
                if also:
                    self.client.commit_if([], also)
                return False
            data, record = decode_work(stored)
            data["record"] = record_to_json(replace(record, status=status))
            # Under the record's own lease: a put without one would keep it for ever.
            rewrite = Put(key, json.dumps(data).encode(), stored.lease)
            if self.client.commit_if([(key, stored.mod_revision)], [rewrite, *also]):
                return True
        raise StorageUnavailable(f"work record {request_id} kept changing under other replicas; retry")


def quarantine_from_kv(kv: KeyValue) -> QuarantineEntry:
    """A stored quarantine; StorageDamaged naming the key if malformed."""
    data = decode_object(kv, "reason", "request_id", "since", "evidence")
    request_id, evidence = data["request_id"], data["evidence"]
    try:
        return QuarantineEntry(
            NodeId(kv.key.removeprefix(QUARANTINE_PREFIX)),
            str(data["reason"]),
            None if request_id is None else RequestId(str(request_id)),
            float(data["since"]),
            None if evidence is None else evidence_from_json(evidence),
        )
    except (ValueError, TypeError, KeyError, AttributeError, InvalidArgument) as error:
        raise StorageDamaged(f"etcd key {kv.key} holds a malformed quarantine: {error!r}") from None
