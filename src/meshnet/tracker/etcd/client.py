"""The one home of etcd's v3 API in meshnet: its JSON gateway (``/v3/kv/*``, ``/v3/lease/*``) over httpx.

Why the JSON gateway and not gRPC stubs or ``aetcd``: every etcd 3.4 member serves it on its
client port, it needs no generated code of etcd's protos beside ours, and httpx is already a
dependency; ``aetcd`` pins a protobuf older than ours. A store call is one small request
(tens of bytes), so JSON costs nothing measurable next to the raft round trip and fsync.

The client knows every member: a member that refuses the connection, times out or answers
that it has no leader is skipped and the next one asked, so one dead member costs a request
one extra connect, not a failure. When no member answers, the call raises
``StorageUnavailable`` (UNAVAILABLE: retry), having changed nothing it knows of.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from meshnet.core.errors import FailedPrecondition, InvalidArgument, StorageFull, StorageUnavailable

logger = logging.getLogger(__name__)

WATCH_IDLE_S = 10.0
"""A watch stream quiet this long is reopened (on the next member when its member went away
without closing the connection, as a machine that lost power does). Watches ask for progress
notifications, which a member sends on a quiet stream every
``--experimental-watch-progress-notify-interval``: run members with less than this (5 s, as
``deploy.etcd_cluster`` does) and a live quiet stream is never taken for a dead one. At etcd's
default (10 min) a quiet stream is reopened every ``WATCH_IDLE_S``, which costs a reconnect."""
REQUEST_TIMEOUT_S = 3.0
"""Longer than an election (etcd's default election timeout is 1 s) so a write arriving while a
new leader is elected waits for it instead of failing over to members that also wait."""


PERMANENT_STATUSES = frozenset({400, 401, 403, 404, 413})
"""Answers every member would give again (too many operations in a transaction, a request too
large, a lease not found, a revision compacted): not worth a failover nor a retry as is."""


class EtcdRefused(FailedPrecondition):
    """etcd refused the request itself (not one member's trouble): retrying it unchanged fails again."""


class LeaseNotFound(EtcdRefused):
    """A write named a lease etcd no longer has (it expired or was revoked): a new one is needed."""


SPACE_EXCEEDED = "database space exceeded"
"""What etcd answers (HTTP 429, gRPC RESOURCE_EXHAUSTED) to every write once its backend passed
``--quota-backend-bytes`` and raised the NOSPACE alarm; reads and deletes still work."""
LEASE_NOT_FOUND = "requested lease not found"


def wrote(path: str, body: dict[str, Any], reply: dict[str, Any]) -> bool:
    """Whether a successful request took space etcd refuses under NOSPACE (a put, a lease): the
    alarm is off. Deletes and reads pass during the alarm, so they prove nothing."""
    if path == "/v3/lease/grant":
        return True
    if path != "/v3/kv/txn" or not reply.get("succeeded", False):
        return False
    return any("request_put" in operation for operation in body.get("success", []))


def space_exceeded(path: str) -> StorageFull:
    """The error every write raises while etcd's NOSPACE alarm is on, saying what frees it."""
    return StorageFull(
        f"the tracker's etcd store is full (NOSPACE alarm, '{SPACE_EXCEEDED}' on {path}): it refuses "
        "every write, work records included, until its operator frees space: compact and defragment "
        "(etcdctl compact $(REVISION); etcdctl defrag --cluster) then etcdctl alarm disarm, or restart "
        "the members with a larger --quota-backend-bytes, or shorten the trackers' --work-retention"
    )


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int


@dataclass(frozen=True)
class Put:
    """One write in a transaction: ``key`` = ``value`` (under ``lease`` when not 0)."""

    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    key: str


Operation = Put | Delete


def parse_endpoints(store: str) -> tuple[str, ...]:
    """``etcd://HOST:PORT[,HOST:PORT...]`` → the members' base URLs (InvalidArgument if malformed)."""
    prefix = "etcd://"
    if not store.startswith(prefix):
        raise InvalidArgument(f"--store must be etcd://HOST:PORT[,HOST:PORT...], got {store!r}")
    endpoints = []
    for member in store[len(prefix) :].split(","):
        host, _, port = member.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument(f"--store names etcd members as HOST:PORT, got {member!r} in {store!r}")
        endpoints.append(f"http://{host}:{port}")
    return tuple(endpoints)


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode()


def _prefix_end(prefix: str) -> str:
    """The first key after every key starting with ``prefix`` (etcd's range_end for a prefix)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


def _kvs(reply: dict[str, Any]) -> list[KeyValue]:
    """The key-values of a range reply; one that is not a meshnet key (not UTF-8: nothing of
    ours wrote it) or not one of etcd's is skipped, logged, so it cannot stop a replica."""
    found = []
    for kv in reply.get("kvs", []):
        try:
            found.append(
                KeyValue(
                    base64.b64decode(kv["key"]).decode(),
                    base64.b64decode(kv.get("value", "")),
                    int(kv.get("mod_revision", 0)),
                    int(kv.get("create_revision", 0)),
                    int(kv.get("lease", 0)),
                )
            )
        except (ValueError, TypeError, KeyError) as error:
            logger.warning("an etcd key that is not meshnet's skipped: %s", error)
    return found


def _operation(operation: Operation) -> dict[str, Any]:
    if isinstance(operation, Put):
        put: dict[str, Any] = {"key": _b64(operation.key), "value": _b64(operation.value)}
        if operation.lease:
            put["lease"] = str(operation.lease)
        return {"request_put": put}
    return {"request_delete_range": {"key": _b64(operation.key)}}


def ends_watch(result: dict[str, Any]) -> bool:
    """Whether a watch reply says etcd ended the watch: cancelled, or its start compacted away
    (``compact_revision``; the JSON gateway leaves zero values out and writes int64 as strings)."""
    return bool(result.get("canceled")) or int(result.get("compact_revision", 0)) != 0


def progress_revision(result: dict[str, Any]) -> int | None:
    """The revision a progress notification says every change was delivered up to; None for any
    other reply (the stream's creation, events, or the end of the watch, which proves nothing)."""
    if result.get("created") or result.get("events") or ends_watch(result):
        return None
    return int(result.get("header", {}).get("revision", 0))


class EtcdClient:
    """Blocking calls to an etcd cluster; safe from several threads (one httpx client, locked endpoint)."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        if not endpoints:
            raise InvalidArgument("an etcd store needs at least one member address")
        self._endpoints = list(endpoints)
        self._preferred = 0
        self._lock = threading.Lock()
        self._http = httpx.Client(timeout=timeout_s)
        self._space_alarm = False
        """Whether the last write met etcd's NOSPACE alarm: logged once, when it starts and ends."""

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to the preferred member, then to each other; StorageUnavailable if none answers,
        EtcdRefused (no failover: every member would refuse it) if one refuses the request."""
        with self._lock:
            start = self._preferred
        failures = []
        timed_out = False
        for offset in range(len(self._endpoints)):
            index = (start + offset) % len(self._endpoints)
            endpoint = self._endpoints[index]
            try:
                response = self._http.post(endpoint + path, json=body)
            except (httpx.ReadTimeout, httpx.WriteTimeout) as error:
                # The request may have reached a member and been applied although no reply came.
                timed_out = True
                failures.append(f"{endpoint}: {type(error).__name__}")
                continue
            except httpx.HTTPError as error:
                failures.append(f"{endpoint}: {type(error).__name__}")
                continue
            if response.status_code != 200 and SPACE_EXCEEDED in response.text:  # the alarm is the cluster's
                raise self._space_alarm_seen(path)
            if response.status_code in PERMANENT_STATUSES:
                refused = LeaseNotFound if LEASE_NOT_FOUND in response.text else EtcdRefused
                raise refused(f"etcd refused {path}: HTTP {response.status_code} {response.text[:200]}")
            if response.status_code != 200:
                # No leader, lost quorum, too many requests: another member may do better.
                failures.append(f"{endpoint}: HTTP {response.status_code} {response.text[:200]}")
                continue
            try:
                reply: dict[str, Any] = response.json()
            except ValueError:
                failures.append(f"{endpoint}: a reply that is not JSON: {response.text[:80]!r}")
                continue
            if not isinstance(reply, dict):
                failures.append(f"{endpoint}: a reply that is not a JSON object")
                continue
            with self._lock:
                self._preferred = index
            if self._space_alarm and wrote(path, body, reply):
                self._space_alarm_cleared()
            return reply
        outcome = "outcome unknown (it may have been applied)" if timed_out else "nothing was stored; retry"
        raise StorageUnavailable(
            "no etcd member of the tracker's store answered (" + "; ".join(failures) + f"): {outcome}"
        )

    def _space_alarm_seen(self, path: str) -> StorageFull:
        error = space_exceeded(path)
        with self._lock:
            first, self._space_alarm = not self._space_alarm, True
        if first:  # once, not once per refused write (at 100 records/s the log would be nothing else)
            logger.error("%s", error.message)
        return error

    def _space_alarm_cleared(self) -> None:
        with self._lock:
            cleared, self._space_alarm = self._space_alarm, False
        if cleared:
            logger.warning("the tracker's etcd store accepts writes again (its NOSPACE alarm is off)")

    def get(self, key: str) -> KeyValue | None:
        found = _kvs(self._post("/v3/kv/range", {"key": _b64(key)}))
        return found[0] if found else None

    def get_prefix(self, prefix: str, *, keys_only: bool = False, after_revision: int = 0) -> list[KeyValue]:
        """Every key starting with ``prefix``, in key order (``keys_only``: values left empty;
        ``after_revision``: only keys changed after it)."""
        body: dict[str, Any] = {"key": _b64(prefix), "range_end": _prefix_end(prefix)}
        if keys_only:
            body["keys_only"] = True
        if after_revision:
            body["min_mod_revision"] = str(after_revision + 1)
        return _kvs(self._post("/v3/kv/range", body))

    def get_prefix_pages(self, prefix: str, page_size: int) -> Iterator[list[KeyValue]]:
        """Every key starting with ``prefix``, in key order, ``page_size`` at a time: no one reply
        holds them all (etcd builds each reply in memory, and the JSON gateway's is base64 on top).
        Every page is read at the first page's revision, so together they are one snapshot (a
        listing that outlives the replicas' compaction, a minute or more, fails as refused)."""
        body: dict[str, Any] = {"key": _b64(prefix), "range_end": _prefix_end(prefix), "limit": str(page_size)}
        while True:
            reply = self._post("/v3/kv/range", body)
            raw = reply.get("kvs", [])
            found = _kvs(reply)
            if found:
                yield found
            if not reply.get("more", False) or not raw:
                return
            # After the last key etcd returned (even one ``_kvs`` skipped): the next page starts there.
            body["key"] = _b64(base64.b64decode(raw[-1]["key"]) + b"\0")
            body.setdefault("revision", str(reply["header"]["revision"]))

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Write ``key``; the revision it was written at."""
        return self.write([Put(key, value, lease)])

    def delete(self, key: str) -> None:
        self._post("/v3/kv/deleterange", {"key": _b64(key)})

    def create(self, key: str, value: bytes, also: Sequence[Operation] = (), lease: int = 0) -> KeyValue | None:
        """Write ``key`` (under ``lease`` when not 0; and ``also``) only if ``key`` is absent,
        atomically: None if written, else the stored value (and nothing written)."""
        compare = [{"target": "CREATE", "key": _b64(key), "result": "EQUAL", "create_revision": "0"}]
        reply = self._txn(compare, [Put(key, value, lease), *also], failure=[{"request_range": {"key": _b64(key)}}])
        if reply.get("succeeded", False):
            return None
        found = _kvs(reply["responses"][0]["response_range"])
        return found[0] if found else None

    def write(self, operations: Sequence[Operation]) -> int:
        """Apply ``operations`` atomically; the revision they were written at."""
        return int(self._txn([], operations)["header"]["revision"])

    def commit_if(self, unchanged: Sequence[tuple[str, int]], operations: Sequence[Operation]) -> bool:
        """Apply ``operations`` atomically if every (key, mod_revision) is as given (0: the key is
        absent); False (nothing applied) if one changed."""
        compare = [
            {"target": "MOD", "key": _b64(key), "result": "EQUAL", "mod_revision": str(revision)}
            for key, revision in unchanged
        ]
        return bool(self._txn(compare, operations).get("succeeded", False))

    def _txn(
        self,
        compare: list[dict[str, Any]],
        operations: Sequence[Operation],
        failure: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"compare": compare, "success": [_operation(op) for op in operations]}
        if failure:
            body["failure"] = failure
        return self._post("/v3/kv/txn", body)

    def compact(self, revision: int) -> None:
        """Drop the history before ``revision`` (etcd keeps every version until compacted); a
        revision another replica compacted past already is not an error."""
        try:
            self._post("/v3/kv/compaction", {"revision": str(revision)})
        except EtcdRefused as error:
            if "compacted" not in error.message:
                raise

    def grant_lease(self, ttl_s: int) -> int:
        return int(self._post("/v3/lease/grant", {"TTL": str(ttl_s)})["ID"])

    def keep_alive(self, lease: int) -> bool:
        """Renew ``lease`` once; False if it expired already (its keys are gone)."""
        reply = self._post("/v3/lease/keepalive", {"ID": str(lease)})
        return int(reply.get("result", {}).get("TTL", 0)) > 0

    def follow(
        self,
        key: str,
        on_value: Callable[[bytes], None],
        stopped: threading.Event,
        opened: threading.Event | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        """Blocking (a thread of its own): call ``on_value`` with each value ``key`` is given, as
        etcd's watch stream reports it, until ``stopped``; reopened on another member when one
        fails. Values written while no stream was open are missed: a caller that must not miss
        one also reads the key from time to time. ``opened`` is set once etcd confirms a stream;
        ``on_progress`` gets the revision of each progress notification (the stream is alive and
        has delivered every change up to it: ``WATCH_IDLE_S``)."""
        timeout = httpx.Timeout(REQUEST_TIMEOUT_S, read=WATCH_IDLE_S)
        body = {"create_request": {"key": _b64(key), "progress_notify": True}}
        with httpx.Client(timeout=timeout) as http:
            while not stopped.is_set():
                for endpoint in self._endpoints:
                    try:
                        with http.stream("POST", endpoint + "/v3/watch", json=body) as response:
                            for line in response.iter_lines():
                                if stopped.is_set():
                                    return
                                result = json.loads(line).get("result", {})
                                if opened is not None and result.get("created"):
                                    opened.set()
                                if ends_watch(result):  # a new stream now, not after WATCH_IDLE_S of silence
                                    logger.info("etcd ended the watch of %s on %s: %s", key, endpoint, result)
                                    break
                                for event in result.get("events", []):
                                    on_value(base64.b64decode(event["kv"].get("value", "")))
                                progress = progress_revision(result)
                                if on_progress is not None and progress is not None:
                                    on_progress(progress)
                    except (httpx.HTTPError, ValueError, KeyError) as error:
                        logger.debug("etcd watch of %s on %s ended: %s", key, endpoint, error)
                    if stopped.is_set():
                        return
                stopped.wait(0.2)
