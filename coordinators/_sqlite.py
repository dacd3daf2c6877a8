"""The SQLite file of ``SQLiteStateStore``: its schema, its writing and read-only
connections, and the transactions every write and every read runs in."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from transactional.errors import ConfigurationError, CoordinatorError, StoreUnavailableError

__all__ = [
    "BUSY_TIMEOUT_MS",
    "immediate",
    "open_reader",
    "open_writer",
    "rollback",
    "transaction",
]

SCHEMA = """
CREATE TABLE IF NOT EXISTS topology_identity (
    topology_id TEXT PRIMARY KEY,
    spout TEXT NOT NULL,
    kind TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS currtx (
    topology_id TEXT PRIMARY KEY,
    txid INTEGER NOT NULL,
    fence INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS coordinator_meta (
    topology_id TEXT NOT NULL,
    txid INTEGER NOT NULL,
    meta TEXT NOT NULL,
    PRIMARY KEY (topology_id, txid)
);
CREATE TABLE IF NOT EXISTS digest (
    topology_id TEXT NOT NULL,
    txid INTEGER NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (topology_id, txid)
);
CREATE TABLE IF NOT EXISTS commit_group (
    topology_id TEXT PRIMARY KEY,
    first INTEGER NOT NULL,
    last INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS runner_status (
    topology_id TEXT PRIMARY KEY,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rewind (
    topology_id TEXT PRIMARY KEY,
    txid INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS partition_meta (
    topology_id TEXT NOT NULL,
    txid INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    meta TEXT NOT NULL,
    PRIMARY KEY (topology_id, txid, partition)
);
"""

#: How long a writer waits for another connection's write transaction before failing.
BUSY_TIMEOUT_MS = 30_000


def open_writer(path: Path) -> sqlite3.Connection:
    """A connection that writes, to the store at ``path`` (made, with its tables, if
    missing)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: every write opens its own BEGIN IMMEDIATE (``immediate``).
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        # WAL with synchronous=NORMAL may lose the last commits on power loss; an
        # advance that is forgotten after its sinks committed would be replayed.
        conn.execute("PRAGMA synchronous = FULL")
        conn.executescript(SCHEMA)
    except (OSError, sqlite3.Error) as exc:
        raise StoreUnavailableError(
            f"cannot open the SQLite state store {path}: {exc}; check that the "
            "directory is writable and the file is an SQLite database"
        ) from exc
    return conn


def open_reader(path: Path) -> sqlite3.Connection:
    """A connection that cannot write, to a store file that must exist."""
    if not path.is_file():
        raise ConfigurationError(
            f"there is no SQLite state store at {path} (no such file); check "
            "--state-dir: a run creates the store there"
        )
    # With no writer about (no WAL file), ``immutable`` keeps SQLite from creating its
    # WAL index files beside the database: a look must leave the directory as it was.
    idle = not path.with_name(path.name + "-wal").exists()
    try:
        conn = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro{'&immutable=1' if idle else ''}",
            uri=True,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        raise StoreUnavailableError(
            f"cannot read the SQLite state store {path}: {exc}; is it an SQLite database?"
        ) from exc
    return conn


def immediate(conn: sqlite3.Connection, path: Path) -> AbstractContextManager[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction: it takes SQLite's write lock up front, so
    what it reads cannot change before it commits."""
    return transaction(conn, path, write=True)


@contextmanager
def transaction(
    conn: sqlite3.Connection, path: Path, *, write: bool
) -> Iterator[sqlite3.Connection]:
    """One transaction on ``conn``, committed when the block ends, rolled back if it
    raises: a write (``BEGIN IMMEDIATE``, whose lock not got in time is a
    ``StoreUnavailableError``) or one snapshot for every read in the block (``BEGIN``).
    SQLite's errors become ``CoordinatorError`` naming the file."""
    doing = "write" if write else "read"
    try:
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    except sqlite3.Error as exc:
        failed = StoreUnavailableError if write else CoordinatorError
        raise failed(f"cannot {doing} the state store {path}: {exc}") from exc
    try:
        yield conn
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        rollback(conn)
        raise CoordinatorError(f"cannot {doing} the state store {path}: {exc}") from exc
    except BaseException:
        rollback(conn)
        raise


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if any: some errors (a full disk, say) make
    SQLite roll back by itself."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")
