"""The tracker database's tables, and the migration of older files to them (``tracker.store``)."""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 3
"""2: work records may be ``unverified`` (DGR-013); 3: ``disputed`` and ``completed_by_shards``
(``tracker.work_checks``). An older file is migrated on open."""


def _work_records_table(name: str) -> str:
    return f"""
CREATE TABLE IF NOT EXISTS {name} (
    request_id TEXT PRIMARY KEY,
    session_id TEXT,
    model TEXT NOT NULL,
    status TEXT NOT NULL CHECK (
        status IN ('completed', 'cancelled', 'failed', 'unverified', 'disputed', 'completed_by_shards')
    ),
    tokens_in INTEGER NOT NULL,
    tokens_out INTEGER NOT NULL,
    billing_units REAL NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    recorded_at REAL NOT NULL,
    content_sha256 TEXT NOT NULL
);
"""


_SCHEMA = (
    _work_records_table("work_records")
    + """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    model TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    layer_start INTEGER NOT NULL,
    layer_stop INTEGER NOT NULL,
    registration_json TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_registered REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS work_shares (
    request_id TEXT NOT NULL REFERENCES work_records(request_id),
    position INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    layer_start INTEGER NOT NULL,
    layer_stop INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    PRIMARY KEY (request_id, position)
);
CREATE INDEX IF NOT EXISTS work_shares_by_node ON work_shares(node_id);
CREATE TABLE IF NOT EXISTS work_disputes (
    request_id TEXT PRIMARY KEY REFERENCES work_records(request_id),
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantined_nodes (
    node_id TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    request_id TEXT,
    since REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantine_evidence (
    node_id TEXT PRIMARY KEY REFERENCES quarantined_nodes(node_id) ON DELETE CASCADE,
    evidence_json TEXT NOT NULL
);
"""
)


def create_schema(connection: sqlite3.Connection) -> None:
    """Create what a new file lacks, and bring an older file to this schema."""
    connection.executescript(_SCHEMA)
    connection.execute(
        "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?), ('epoch', 0)",
        (SCHEMA_VERSION,),
    )
    _migrate(connection)


def _migrate(connection: sqlite3.Connection) -> None:
    """Bring a version-1 file to this schema: SQLite cannot alter a CHECK, so the table of
    work records is rebuilt (the documented 12-step way), keeping rows and their order."""
    (version,) = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if version >= SCHEMA_VERSION:
        return
    connection.execute("PRAGMA foreign_keys=OFF")  # only takes effect outside a transaction
    connection.execute("BEGIN IMMEDIATE")
    try:
        connection.execute(_work_records_table("work_records_next"))
        connection.execute("INSERT INTO work_records_next SELECT * FROM work_records ORDER BY rowid")
        connection.execute("DROP TABLE work_records")
        connection.execute("ALTER TABLE work_records_next RENAME TO work_records")
        connection.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,))
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    finally:
        connection.execute("PRAGMA foreign_keys=ON")
