"""The results store: one row per finished run, in any database SQLAlchemy reaches.

Where: ``--store URL`` or ``DPBENCH_STORE`` (a SQLAlchemy URL, e.g. ``postgresql://user@host/db`` for a group), by
default a SQLite file ``results.sqlite`` under ``DPBENCH_HOME``; a ``Path`` names a SQLite file. Every command reads
and writes it the same way (``run``, ``tune``, ``sweep`` and its resume, ``leaderboard``, ``runs``, ``show``).

Appends are atomic: one record is one ``INSERT`` in its own transaction, so a process killed while appending leaves
the record whole or absent, and a duplicate ``run_id`` (the record's content hash: the same record from two machines)
is skipped by the database (``ON CONFLICT DO NOTHING``), also between concurrent writers. SQLite serializes writers
with a file lock (WAL mode, 60 s busy timeout); its switch to WAL, which SQLite refuses at once rather than wait when
two processes create the file together, is retried until the same timeout.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import sqlalchemy
from sqlalchemy.dialects import postgresql, sqlite

from dpbench.data.files import dpbench_home
from dpbench.errors import UsageError

BUSY_TIMEOUT_SECONDS = 60
_RUNS = sqlalchemy.Table(
    "runs", sqlalchemy.MetaData(),
    sqlalchemy.Column("run_id", sqlalchemy.String(64), primary_key=True),
    sqlalchemy.Column("task", sqlalchemy.Text, nullable=False),
    sqlalchemy.Column("method", sqlalchemy.Text, nullable=False),
    sqlalchemy.Column("data_id", sqlalchemy.Text, nullable=False),
    sqlalchemy.Column("created_at", sqlalchemy.Text, nullable=False),
    sqlalchemy.Column("record", sqlalchemy.Text, nullable=False),
    # The order of appends, for records created in the same second (the seeds of a batch): this identity column,
    # or in SQLite the rowid (its table is created by SQLITE_SCHEMA, without this column, as it always was).
    sqlalchemy.Column("seq", sqlalchemy.BigInteger, sqlalchemy.Identity(), nullable=False),
)
SQLITE_SCHEMA = """
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
    """The default SQLite file (used when neither ``--store`` nor ``DPBENCH_STORE`` names another store)."""
    return dpbench_home() / "results.sqlite"


def _url(where: Path | str | None) -> str:
    """A SQLAlchemy URL for ``where``: a URL, a SQLite file's path, or None for ``DPBENCH_STORE`` or the default."""
    if where is None:
        where = os.environ.get("DPBENCH_STORE") or default_path()
    if isinstance(where, Path) or "://" not in str(where):
        return f"sqlite:///{Path(where)}"
    return str(where)


def describe(where: Path | str | None = None) -> str:
    """The store as a user should read it: a SQLite file's path, or the URL without its password."""
    url = _url(where)
    if url.startswith("sqlite:///"):
        return url[len("sqlite:///"):]
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def content_id(record: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a record without its ``run_id``, shortened to 16 hex digits."""
    body = {key: value for key, value in record.items() if key != "run_id"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def _sqlite_file(url: str) -> Path | None:
    return Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None


@functools.lru_cache(maxsize=8)
def _engine(url: str, pid: int) -> sqlalchemy.Engine:
    """One engine per URL and process (a forked child must not share its parent's connections)."""
    if _sqlite_file(url) is not None:
        # No pool: each append opens and closes the file, so that no lock outlives a call.
        engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool,
                                          connect_args={"timeout": BUSY_TIMEOUT_SECONDS})
    else:
        engine = sqlalchemy.create_engine(url, pool_pre_ping=True)
    return engine


def _connect(url: str, create: bool = True) -> sqlalchemy.Connection:
    """A connection; with ``create``, the ``runs`` table in place (and SQLite in WAL mode, retried while another
    process holds the file's lock to do the same). Readers pass ``create=False``: reading changes nothing."""
    try:
        engine = _engine(url, os.getpid())
    except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError, ImportError) as error:
        raise UsageError(f"cannot use the results store {describe(url)}: {error}") from None
    file = _sqlite_file(url)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    while True:
        try:
            connection = engine.connect()
        except sqlalchemy.exc.OperationalError as error:
            if file is not None and "locked" in str(error) and time.monotonic() < deadline:
                time.sleep(random.uniform(0.005, 0.05))
                continue
            reason = " ".join(str(error.orig or error).split())[:200]
            raise UsageError(f"cannot reach the results store {describe(url)}: {reason}") from None
        if not create:
            return connection
        try:
            if file is not None:
                connection.exec_driver_sql("PRAGMA journal_mode=WAL")
                connection.exec_driver_sql(SQLITE_SCHEMA)
            else:
                connection.execute(sqlalchemy.schema.CreateTable(_RUNS, if_not_exists=True))
            connection.commit()
            return connection
        except sqlalchemy.exc.OperationalError as error:
            connection.close()
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            # two processes creating the table at once: PostgreSQL's IF NOT EXISTS is not atomic
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))


def _insert(dialect: str):
    if dialect == "postgresql":
        return postgresql.insert(_RUNS).on_conflict_do_nothing(index_elements=["run_id"])
    if dialect == "sqlite":
        return sqlite.insert(_RUNS).on_conflict_do_nothing(index_elements=["run_id"])
    return None


def append(record: dict[str, Any], where: Path | str | None = None) -> None:
    """Store a finished run's record (one transaction; a duplicate ``run_id`` is a no-op)."""
    row = {"run_id": record["run_id"], "task": record["task"], "method": record["method"],
           "data_id": record["data_id"], "created_at": record["created_at"],
           "record": json.dumps(record, sort_keys=True)}
    connection = _connect(_url(where))
    try:
        statement = _insert(connection.dialect.name)
        if statement is not None:
            connection.execute(statement, row)
        else:  # other databases: the primary key refuses a duplicate
            try:
                connection.execute(_RUNS.insert(), row)
            except sqlalchemy.exc.IntegrityError:
                connection.rollback()
                return
        connection.commit()
    finally:
        connection.close()


def exists(where: Path | str | None = None) -> bool:
    """Whether the store holds anything to read (a SQLite file that does not exist holds nothing)."""
    file = _sqlite_file(_url(where))
    return file is None or file.exists()


def load(where: Path | str | None = None, kind: str | None = "run", **filters: str) -> list[dict[str, Any]]:
    """All stored records of ``kind`` (``"run"``, the default: training runs; ``"audit"``: the records of
    ``dpbench.trust.audit``; ``"federated"``: ``dpbench federated``'s; None: every record), oldest first, optionally
    filtered by equality on ``task``, ``method`` or ``data_id``."""
    unknown = set(filters) - {"task", "method", "data_id"}
    if unknown:
        raise ValueError(f"cannot filter runs by {sorted(unknown)}")
    url = _url(where)
    if not exists(url):
        return []
    connection = _connect(url, create=False)
    try:
        if not sqlalchemy.inspect(connection).has_table("runs"):
            return []
        appended = sqlalchemy.literal_column("rowid") if connection.dialect.name == "sqlite" else _RUNS.c.seq
        query = sqlalchemy.select(_RUNS.c.record).order_by(_RUNS.c.created_at, appended)
        for column, value in filters.items():
            query = query.where(_RUNS.c[column] == value)
        rows = connection.execute(query).fetchall()
    finally:
        connection.close()
    records = (json.loads(row[0]) for row in rows)
    return [record for record in records if kind is None or record.get("kind", "run") == kind]
