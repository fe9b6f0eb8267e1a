"""The route epoch, kept a second time outside the database, in a small file beside it.

Workers refuse routes older than the epoch they were last told. A tracker that lost its
database (an emptied or replaced file) and started again at epoch 1 would hand out only routes
every worker refuses: 88 of 90 requests failed that way with no recovery (issue 29, finding 8).
So every epoch the store saves is also written here, atomically (a temporary file, fsync,
rename, fsync of the directory), and the tracker starts above the larger of the two. When both
are gone, the workers' own reports at registration move it on (``NodeRegistry.adopt_epoch``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from meshnet.core.errors import StorageUnavailable

logger = logging.getLogger(__name__)


def epoch_file_beside(db_path: Path) -> Path:
    """Where the epoch of the database at ``db_path`` is kept: ``tracker.sqlite3.epoch``."""
    return db_path.with_name(db_path.name + ".epoch")


class EpochFile:
    """The highest epoch written, as decimal text; 0 when there is none."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> int:
        """The stored epoch; a missing or unreadable file counts as 0 (the database still has one)."""
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return 0
        except (OSError, UnicodeDecodeError) as error:
            logger.warning("cannot read the epoch file %s (%s): using the database's epoch alone", self.path, error)
            return 0
        if not text.isdigit():
            logger.warning(
                "the epoch file %s holds %r, not an epoch: using the database's epoch alone", self.path, text
            )
            return 0
        return int(text)

    def save(self, epoch: int) -> None:
        """Replace the stored epoch with ``epoch``, durably; ``StorageUnavailable`` if the disk refuses."""
        temporary = self.path.with_name(self.path.name + ".tmp")
        try:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(descriptor, f"{epoch}\n".encode("ascii"))
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            os.replace(temporary, self.path)
            _sync_directory(self.path.parent)
        except OSError as error:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise StorageUnavailable(
                f"cannot write the epoch file {self.path}: {error.strerror or error}; retry once the disk is back"
            ) from error


def _sync_directory(folder: Path) -> None:
    """Make a rename in ``folder`` durable: the new name is on disk before we say it is."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
