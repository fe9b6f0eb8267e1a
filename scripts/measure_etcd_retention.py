"""How much etcd backend one work record costs, so ``--work-retention`` can be chosen against
etcd's space quota (issue 36 follow-up: records must leave etcd before the NOSPACE alarm).

    flock /tmp/bench.lock python scripts/measure_etcd_retention.py \\
        --out bench/results/tracker_scale/etcd_retention.json

Writes ``--records`` records through ``EtcdTrackerStore`` (one bucket's lease, as a replica
does) into a fresh one-member etcd, reads ``/v3/maintenance/status`` (dbSize: the file;
dbSizeInUse: its pages in use) before, after, and after a compaction and a defragmentation
(what a deployment's periodic compaction reaches), then revokes the bucket's lease (what
etcd does when it expires) and times it.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from bench_etcd_store import record

from meshnet.deploy.etcd_cluster import etcd_cluster
from meshnet.tracker.etcd.client import EtcdClient, parse_endpoints
from meshnet.tracker.etcd.retention import DEFAULT_RETENTION_S, RetentionPolicy
from meshnet.tracker.etcd.store import WORK_PREFIX, EtcdTrackerStore

DEFAULT_QUOTA_BYTES = 2 * 1024**3
"""etcd 3.4's default ``--quota-backend-bytes``."""


def status(url: str) -> dict[str, int]:
    reply = httpx.post(url + "/v3/maintenance/status", json={}, timeout=30.0).json()
    return {"db_size": int(reply["dbSize"]), "db_size_in_use": int(reply.get("dbSizeInUse", reply["dbSize"]))}


def compact_and_defragment(client: EtcdClient, url: str) -> None:
    revision = client.write([])
    httpx.post(url + "/v3/kv/compaction", json={"revision": str(revision), "physical": True}, timeout=120.0)
    httpx.post(url + "/v3/maintenance/defragment", json={}, timeout=120.0)


def measure(records: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, etcd_cluster(Path(tmp), size=1) as cluster:
        url = cluster.members[0].client_url
        client = EtcdClient(parse_endpoints(cluster.store))
        store = EtcdTrackerStore(client, retention=RetentionPolicy(DEFAULT_RETENTION_S))
        compact_and_defragment(client, url)
        empty = status(url)
        value_bytes = 0
        for index in range(records):
            store.record_work(record(index), recorded_at=time.time())
        stored = client.get(WORK_PREFIX + record(0).request_id)
        value_bytes = 0 if stored is None else len(stored.value) + len(stored.key)
        written = status(url)
        compact_and_defragment(client, url)
        compacted = status(url)
        lease = stored.lease if stored is not None else 0
        start = time.perf_counter()
        httpx.post(url + "/v3/lease/revoke", json={"ID": str(lease)}, timeout=120.0)
        revoke_s = time.perf_counter() - start
        left = len(client.get_prefix(WORK_PREFIX, keys_only=True))
        compact_and_defragment(client, url)
        revoked = status(url)
        client.close()
    per_record = (compacted["db_size_in_use"] - empty["db_size_in_use"]) / records
    return {
        "records": records,
        "key_and_value_bytes_per_record": value_bytes,
        "empty": empty,
        "after_writes": written,
        "after_compact_defrag": compacted,
        "backend_bytes_per_record_uncompacted": round((written["db_size"] - empty["db_size"]) / records, 1),
        "backend_bytes_per_record": round(per_record, 1),
        "lease_revoke_s": round(revoke_s, 3),
        "lease_revoke_keys_left": left,
        "after_revoke_compact_defrag": revoked,
        "default_quota_bytes": DEFAULT_QUOTA_BYTES,
        "records_in_default_quota": int(DEFAULT_QUOTA_BYTES / per_record),
        "days_in_default_quota_at_100_records_per_s": round(DEFAULT_QUOTA_BYTES / per_record / 100 / 86400, 2),
        "default_retention_s": DEFAULT_RETENTION_S,
        "default_bucket_s": RetentionPolicy().bucket_s,
        "records_kept_at_100_per_s_default_retention": int(100 * RetentionPolicy().lease_ttl_s),
        "quota_fraction_at_100_per_s_default_retention": round(
            100 * RetentionPolicy().lease_ttl_s * per_record / DEFAULT_QUOTA_BYTES, 3
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--out", type=Path, required=True)
    arguments = parser.parse_args()
    result = {"host": platform.node(), "etcd_members": 1, **measure(arguments.records)}
    arguments.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
