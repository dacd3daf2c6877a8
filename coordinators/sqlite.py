"""The embedded state store: one SQLite file, no servers.

Leadership is an exclusive ``flock`` on a lock file beside the database, so it only
excludes runners on the same machine (or a file system with working ``flock``).
The lock alone is not a fence: a runner whose lock file was deleted keeps its lock on
the old inode while another runner locks the new one. So every leader also bumps a
``fence`` counter in the database when it takes over, and every write checks that
counter inside its own ``BEGIN IMMEDIATE`` transaction, as ZooKeeper's store checks the
version of ``currtx``.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import Path
from urllib.parse import quote

from transactional.errors import (
    ConfigurationError,
    CoordinatorError,
    FencedError,
    LostLeadershipError,
    StoreUnavailableError,
    UnknownTopologyError,
)
from transactional.store import JsonValue, StateStore, StoredState, TopologyIdentity

_SCHEMA = """
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
CREATE TABLE IF NOT EXISTS partition_meta (
    topology_id TEXT NOT NULL,
    txid INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    meta TEXT NOT NULL,
    PRIMARY KEY (topology_id, txid, partition)
);
"""

# How long a writer waits for another connection's write transaction before failing.
_BUSY_TIMEOUT_MS = 30_000
_LOCK_POLL_SECONDS = 0.05


def _encode(value: JsonValue, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CoordinatorError(
            f"{what} is not JSON-serialisable ({exc}); metadata must be plain JSON values"
        ) from exc


class SQLiteStateStore(StateStore):
    """State of any number of topologies in one SQLite file, rows keyed by topology id."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        self._topology_id: str | None = None
        self._lock_fd: int | None = None
        self._fence: int | None = None

    @property
    def lock_path(self) -> Path:
        """The leadership lock file of the opened topology id."""
        return self.path.with_name(f"{self.path.name}.{quote(self._tid, safe='')}.lock")

    @property
    def _tid(self) -> str:
        if self._topology_id is None:
            raise CoordinatorError("the state store is not open: call open(topology_id) first")
        return self._topology_id

    def open(self, topology_id: str, read_only: bool = False) -> None:
        if not topology_id:
            raise ConfigurationError("the topology id must not be empty")
        if self._conn is not None:
            raise CoordinatorError(f"the state store {self.path} is already open")
        if read_only:
            self._open_read_only(topology_id)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit mode: every write below opens its own BEGIN IMMEDIATE.
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
            # WAL with synchronous=NORMAL may lose the last commits on power loss; an
            # advance that is forgotten after its sinks committed would be replayed.
            conn.execute("PRAGMA synchronous = FULL")
            conn.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailableError(
                f"cannot open the SQLite state store {self.path}: {exc}; check that the "
                "directory is writable and the file is an SQLite database"
            ) from exc
        self._conn = conn
        self._topology_id = topology_id

    def _open_read_only(self, topology_id: str) -> None:
        known = self.topology_ids()  # raises if there is no such file
        if topology_id not in known:
            raise UnknownTopologyError(topology_id, f"the SQLite state store {self.path}", known)
        self._conn = self._reader()
        self._topology_id = topology_id

    def _reader(self) -> sqlite3.Connection:
        """A connection that cannot write, to a file that must exist."""
        if not self.path.is_file():
            raise ConfigurationError(
                f"there is no SQLite state store at {self.path} (no such file); check "
                "--state-dir: a run creates the store there"
            )
        # With no writer about (no WAL file), ``immutable`` keeps SQLite from creating its
        # WAL index files beside the database: a look must leave the directory as it was.
        idle = not self.path.with_name(self.path.name + "-wal").exists()
        try:
            conn = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=ro{'&immutable=1' if idle else ''}",
                uri=True,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailableError(
                f"cannot read the SQLite state store {self.path}: {exc}; is it an SQLite database?"
            ) from exc
        return conn

    def topology_ids(self) -> list[str]:
        if not self.path.is_file():
            raise ConfigurationError(
                f"there is no SQLite state store at {self.path} (no such file); check "
                "--state-dir: a run creates the store there"
            )
        with closing(self._reader()) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if "topology_identity" not in tables:
                return []
            rows = conn.execute("SELECT topology_id FROM topology_identity").fetchall()
        return sorted(r[0] for r in rows)

    def close(self) -> None:
        self._release_lock()
        self._fence = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: it takes SQLite's write lock up front, so
        what it reads cannot change before it commits."""
        conn = self._connection()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"cannot write the state store {self.path}: {exc}") from exc
        try:
            yield conn
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback(conn)
            raise CoordinatorError(f"cannot write the state store {self.path}: {exc}") from exc
        except BaseException:
            self._rollback(conn)
            raise

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        # Some errors (a full disk, say) make SQLite roll back by itself.
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise CoordinatorError("the state store is not open: call open(topology_id) first")
        return self._conn

    def register(self, identity: TopologyIdentity) -> None:
        with self._write() as conn:
            row = conn.execute(
                "SELECT spout, kind FROM topology_identity WHERE topology_id = ?", (self._tid,)
            ).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO topology_identity (topology_id, spout, kind) VALUES (?, ?, ?)",
                    (self._tid, identity.spout, identity.kind),
                )
                return
        stored = TopologyIdentity(spout=row[0], kind=row[1])
        if stored != identity:
            raise ConfigurationError(
                f"topology id {self._tid!r} is registered for spout {stored.spout!r} "
                f"({stored.kind}), not {identity.spout!r} ({identity.kind}); use another "
                f"--topology-id, or delete the state of {self._tid!r} in {self.path} to start over"
            )

    def acquire_leadership(self, timeout: float | None = None) -> None:
        self._connection()
        if self._lock_fd is not None and not self._is_current(self._lock_fd, self.lock_path):
            self._release_lock()  # a lock on a deleted lock file excludes nobody
        if self._lock_fd is None:
            self._lock_fd = self._lock(timeout)
        try:
            with self._write() as conn:
                conn.execute(
                    "INSERT OR IGNORE INTO currtx (topology_id, txid, fence) VALUES (?, 1, 0)",
                    (self._tid,),
                )
                conn.execute(
                    "UPDATE currtx SET fence = fence + 1 WHERE topology_id = ?", (self._tid,)
                )
                (fence,) = conn.execute(
                    "SELECT fence FROM currtx WHERE topology_id = ?", (self._tid,)
                ).fetchone()
        except BaseException:
            self._release_lock()
            raise
        self._fence = int(fence)

    def _lock(self, timeout: float | None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        path = self.lock_path
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                if deadline is not None and time.monotonic() >= deadline:
                    raise LostLeadershipError(
                        f"another runner holds topology {self._tid!r} (lock file {path}, "
                        f"held by {holder}); stop it or wait for it to finish, or use another "
                        "--topology-id"
                    ) from None
                time.sleep(_LOCK_POLL_SECONDS)
                continue
            if self._is_current(fd, path):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
                return fd
            # The file was deleted between our open and our lock: lock the new one.
            os.close(fd)

    @staticmethod
    def _is_current(fd: int, path: Path) -> bool:
        """A lock on an unlinked (or replaced) lock file excludes nobody."""
        try:
            return os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def check_leadership(self) -> None:
        if self._lock_fd is None or self._fence is None:
            raise LostLeadershipError(
                f"this runner does not lead topology {self._topology_id!r}: it never acquired "
                "leadership or has closed the store"
            )
        if not self._is_current(self._lock_fd, self.lock_path):
            raise LostLeadershipError(
                f"the lock file {self.lock_path} of topology {self._tid!r} was deleted or "
                "replaced, so another runner may lead it; stop this runner"
            )
        self._connection()
        try:
            # A connection of its own: a committer may call this from the commit thread
            # while the runner's thread is inside a write on the shared one.
            with closing(sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_MS / 1000)) as conn:
                row = conn.execute(
                    "SELECT fence FROM currtx WHERE topology_id = ?", (self._tid,)
                ).fetchone()
        except sqlite3.Error as exc:
            raise LostLeadershipError(
                f"cannot verify leadership in the state store {self.path}: {exc}"
            ) from exc
        if row is None or row[0] != self._fence:
            raise LostLeadershipError(
                f"another runner took over topology {self._tid!r}; stop this runner"
            )

    def fence_token(self) -> int | None:
        """The ``fence`` counter this runner set: one more for every leadership."""
        return self._fence

    def _require_fence(self) -> int:
        if self._fence is None:
            raise LostLeadershipError(
                f"this runner does not lead topology {self._topology_id!r}: call "
                "acquire_leadership first"
            )
        return self._fence

    def _check_fence(self, conn: sqlite3.Connection) -> int:
        """Inside a write transaction: refuse unless we still hold the fence; return currtx."""
        ours = self._require_fence()
        txid, fence = conn.execute(
            "SELECT txid, fence FROM currtx WHERE topology_id = ?", (self._tid,)
        ).fetchone()
        if fence != ours:
            raise FencedError(
                f"another runner took over topology {self._tid!r} (fence {fence}, ours "
                f"{ours}); this runner must stop without writing"
            )
        return int(txid)

    def read_state(self) -> StoredState:
        conn = self._connection()
        try:
            conn.execute("BEGIN")  # one snapshot for the three reads
            row = conn.execute(
                "SELECT txid FROM currtx WHERE topology_id = ?", (self._tid,)
            ).fetchone()
            metas = conn.execute(
                "SELECT txid, meta FROM coordinator_meta WHERE topology_id = ? ORDER BY txid",
                (self._tid,),
            ).fetchall()
            parts = conn.execute(
                "SELECT txid, partition, meta FROM partition_meta WHERE topology_id = ? "
                "ORDER BY txid, partition",
                (self._tid,),
            ).fetchall()
            has_digests = conn.execute(  # a read-only look at a store older than digests
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'digest'"
            ).fetchone()
            digests = (
                conn.execute(
                    "SELECT txid, digest FROM digest WHERE topology_id = ?", (self._tid,)
                ).fetchall()
                if has_digests
                else []
            )
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback(conn)
            raise CoordinatorError(f"cannot read the state store {self.path}: {exc}") from exc
        partitions: dict[int, dict[int, JsonValue]] = {}
        for txid, partition, meta in parts:
            partitions.setdefault(txid, {})[partition] = json.loads(meta)
        return StoredState(
            currtx=1 if row is None else int(row[0]),
            metas={txid: json.loads(meta) for txid, meta in metas},
            partitions=partitions,
            digests={txid: json.loads(digest) for txid, digest in digests},
        )

    def start_transaction(
        self, txid: int, meta: JsonValue, partitions: Mapping[int, JsonValue]
    ) -> None:
        meta_text = _encode(meta, f"the metadata of txid {txid}")
        part_rows = [
            (self._tid, txid, p, _encode(m, f"the metadata of partition {p} of txid {txid}"))
            for p, m in partitions.items()
        ]
        self._require_fence()
        with self._write() as conn:
            currtx = self._check_fence(conn)
            if txid < currtx:
                raise CoordinatorError(
                    f"txid {txid} is already committed (currtx is {currtx}); it cannot start again"
                )
            exists = conn.execute(
                "SELECT 1 FROM coordinator_meta WHERE topology_id = ? AND txid = ?",
                (self._tid, txid),
            ).fetchone()
            if exists is not None:
                raise CoordinatorError(f"metadata of txid {txid} already stored; it never changes")
            conn.execute(
                "INSERT INTO coordinator_meta (topology_id, txid, meta) VALUES (?, ?, ?)",
                (self._tid, txid, meta_text),
            )
            try:
                conn.executemany(
                    "INSERT INTO partition_meta (topology_id, txid, partition, meta) "
                    "VALUES (?, ?, ?, ?)",
                    part_rows,
                )
            except sqlite3.IntegrityError as exc:
                raise CoordinatorError(
                    f"partition metadata of txid {txid} already stored; it never changes"
                ) from exc

    def advance(self, txid: int, partitions: Mapping[int, JsonValue] | None = None) -> None:
        part_rows = [
            (self._tid, txid, p, _encode(m, f"the metadata of partition {p} of txid {txid}"))
            for p, m in (partitions or {}).items()
        ]
        self._require_fence()
        with self._write() as conn:
            currtx = self._check_fence(conn)
            if currtx != txid:
                raise FencedError(
                    f"cannot advance topology {self._tid!r} past txid {txid}: currtx is {currtx}"
                )
            conn.executemany(
                "INSERT OR REPLACE INTO partition_meta (topology_id, txid, partition, meta) "
                "VALUES (?, ?, ?, ?)",
                part_rows,
            )
            conn.execute("UPDATE currtx SET txid = ? WHERE topology_id = ?", (txid + 1, self._tid))
            conn.execute(
                "DELETE FROM coordinator_meta WHERE topology_id = ? AND txid < ?",
                (self._tid, txid),
            )
            conn.execute(
                "DELETE FROM partition_meta WHERE topology_id = ? AND txid < ?",
                (self._tid, txid),
            )
            conn.execute(
                "DELETE FROM digest WHERE topology_id = ? AND txid <= ?", (self._tid, txid)
            )

    def record_digest(self, txid: int, digest: JsonValue) -> None:
        text = _encode(digest, f"the digest of txid {txid}")
        self._require_fence()
        with self._write() as conn:
            currtx = self._check_fence(conn)
            started = conn.execute(
                "SELECT 1 FROM coordinator_meta WHERE topology_id = ? AND txid = ?",
                (self._tid, txid),
            ).fetchone()
            if txid < currtx or started is None:
                raise CoordinatorError(
                    f"cannot record the digest of txid {txid}: it is not started and "
                    f"uncommitted (currtx is {currtx})"
                )
            try:
                conn.execute(
                    "INSERT INTO digest (topology_id, txid, digest) VALUES (?, ?, ?)",
                    (self._tid, txid, text),
                )
            except sqlite3.IntegrityError as exc:
                raise CoordinatorError(
                    f"the digest of txid {txid} is already stored; it never changes"
                ) from exc

    def retract(self, txid: int) -> None:
        self._require_fence()
        with self._write() as conn:
            currtx = self._check_fence(conn)
            if txid < currtx:
                raise FencedError(
                    f"cannot retract txid {txid} of topology {self._tid!r}: currtx is {currtx}"
                )
            for table in ("coordinator_meta", "partition_meta", "digest"):
                conn.execute(
                    f"DELETE FROM {table} WHERE topology_id = ? AND txid >= ?", (self._tid, txid)
                )
