"""A shard's KV snapshots on its own disk: a directory under the worker's data dir, within a byte
budget, least recently used first out.

Snapshots hold prompt content, so the directory is 0700 and each file 0600, written whole to a
temporary name and renamed (a crash leaves no half file under a snapshot's name; leftovers are
removed at start). The store holds files as ``session_positions.kvsnap`` and knows nothing of
their content: ``session.snapshots`` checks each when it is read back. Calls block on the disk;
the shard makes them off its event loop, so the index is guarded by a lock.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from meshnet.core.ids import SessionId

log = logging.getLogger(__name__)

KEPT_PER_SESSION = 2
"""A session's newest snapshots kept (a resume takes the newest every hop holds: one more covers a
hop whose latest was still being written when its route was lost); older ones only take room."""
SUFFIX = ".kvsnap"
_TEMPORARY = ".partial"


def _session_key(session_id: SessionId) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()[:32]


@dataclass
class SnapshotDisk:
    directory: Path
    budget_bytes: int
    evictions: int = 0
    _files: OrderedDict[tuple[str, int], int] = field(default_factory=OrderedDict)
    _bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        found = []
        for path in self.directory.iterdir():
            if path.suffix != SUFFIX or not self._parse(path.name):
                path.unlink(missing_ok=True)  # a temporary left by a crash, or not ours
                continue
            found.append((path.stat().st_mtime, path))
        for _, path in sorted(found):
            key = self._parse(path.name)
            if key is not None:
                self._files[key] = path.stat().st_size
                self._bytes += self._files[key]
        with self._lock:
            self._evict(0)

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    @property
    def bytes_held(self) -> int:
        return self._bytes

    def put(self, session_id: SessionId, positions: int, data: bytes) -> bool:
        """Keep ``data`` as the session's snapshot at ``positions``; False when it exceeds the
        budget or the disk refuses it (full, gone: a snapshot is never worth failing a step)."""
        if not self.enabled or len(data) > self.budget_bytes:
            return False
        key = (_session_key(session_id), positions)
        path = self._path(key)
        temporary = path.with_name(path.name + _TEMPORARY)
        try:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(data)
        except OSError as error:
            log.warning("snapshot not written to %s: %s", self.directory, error)
            temporary.unlink(missing_ok=True)
            return False
        with self._lock:
            self._drop(key)
            self._evict(len(data))
            os.replace(temporary, path)
            self._files[key] = len(data)
            self._bytes += len(data)
            for older in sorted(n for s, n in self._files if s == key[0])[:-KEPT_PER_SESSION]:
                self._drop((key[0], older))
        return True

    def positions(self, session_id: SessionId) -> list[int]:
        """The positions of the session's snapshots held here, newest first."""
        session = _session_key(session_id)
        with self._lock:
            return sorted((n for s, n in self._files if s == session), reverse=True)

    def get(self, session_id: SessionId, positions: int) -> bytes | None:
        key = (_session_key(session_id), positions)
        with self._lock:
            if key not in self._files:
                return None
            self._files.move_to_end(key)
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def _evict(self, room: int) -> None:
        while self._files and self._bytes + room > self.budget_bytes:
            oldest = next(iter(self._files))
            self._drop(oldest)
            self.evictions += 1

    def _drop(self, key: tuple[str, int]) -> None:
        size = self._files.pop(key, None)
        if size is not None:
            self._bytes -= size
            self._path(key).unlink(missing_ok=True)

    def _path(self, key: tuple[str, int]) -> Path:
        return self.directory / f"{key[0]}_{key[1]}{SUFFIX}"

    @staticmethod
    def _parse(name: str) -> tuple[str, int] | None:
        stem = name.removesuffix(SUFFIX)
        session, _, positions = stem.partition("_")
        if len(session) != 32 or not positions.isdigit():
            return None
        return session, int(positions)
