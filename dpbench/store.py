"""The local results store: one SQLite file under ``DPBENCH_HOME``, one row per finished run.

SQLite serializes writers with a file lock (WAL mode, 60 s busy timeout), so several processes can append at
once; the switch to WAL, which SQLite refuses at once rather than wait when two processes create the file
together, is retried until the same timeout. A record's ``run_id`` is a hash of its content, so the same
record from two machines merges as one.
"""
from __future__ import annotations

import hashlib
import json
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

from dpbench.data import dpbench_home

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    method TEXT NOT NULL,
    data_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    record TEXT NOT NULL
)
"""


def default_path() -> Path:
    return dpbench_home() / "results.sqlite"


def content_id(record: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a record without its ``run_id``, shortened to 16 hex digits."""
    body = {key: value for key, value in record.items() if key != "run_id"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


BUSY_TIMEOUT_SECONDS = 60


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS)
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute(SCHEMA)
            return connection
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                connection.close()
                raise
            time.sleep(random.uniform(0.005, 0.05))


def append(record: dict[str, Any], path: Path | None = None) -> None:
    """Store a finished run's record (in one transaction; a duplicate ``run_id`` is a no-op)."""
    connection = _connect(path or default_path())
    try:
        with connection:
            connection.execute(
                "INSERT OR IGNORE INTO runs VALUES (?, ?, ?, ?, ?, ?)",
                (record["run_id"], record["task"], record["method"], record["data_id"], record["created_at"],
                 json.dumps(record, sort_keys=True)),
            )
    finally:
        connection.close()


def load(path: Path | None = None, kind: str | None = "run", **where: str) -> list[dict[str, Any]]:
    """All stored records of ``kind`` (``"run"``, the default: training runs; ``"audit"``: the records of
    ``dpbench.audit``, whose ``kind`` field says so; None: every record), optionally filtered by equality on
    ``task``, ``method`` or ``data_id``."""
    unknown = set(where) - {"task", "method", "data_id"}
    if unknown:
        raise ValueError(f"cannot filter runs by {sorted(unknown)}")
    path = path or default_path()
    if not path.exists():
        return []
    clauses = " AND ".join(f"{column} = ?" for column in where)
    connection = _connect(path)
    try:
        rows = connection.execute(
            f"SELECT record FROM runs {'WHERE ' + clauses if clauses else ''} ORDER BY created_at",
            tuple(where.values()),
        ).fetchall()
    finally:
        connection.close()
    records = (json.loads(row[0]) for row in rows)
    return [record for record in records if kind is None or record.get("kind", "run") == kind]
