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

import json
import sqlite3
from contextlib import AbstractContextManager, closing
from pathlib import Path
from urllib.parse import quote

from coordinators._fenced import FencedStore, checked_history, decode
from coordinators._lockfile import LockFile, is_held
from coordinators._sqlite import (
    BUSY_TIMEOUT_MS,
    immediate,
    open_reader,
    open_writer,
    transaction,
)
from transactional.errors import (
    ConfigurationError,
    CoordinatorError,
    LostLeadershipError,
    UnknownTopologyError,
)
from transactional.preflight import check_writable_dir
from transactional.store import (
    JsonValue,
    Leadership,
    StoredHistory,
    StoredState,
    TopologyIdentity,
)


class SQLiteStateStore(FencedStore):
    """State of any number of topologies in one SQLite file, rows keyed by topology id.
    ``history``: committed txids whose metadata is kept besides the last, for rewinds."""

    def __init__(self, path: str | Path, history: int = FencedStore.history) -> None:
        self.path = Path(path)
        self.history = checked_history(history)
        self._conn: sqlite3.Connection | None = None
        self._topology_id: str | None = None
        self._lock: LockFile | None = None
        self._fence: int | None = None

    @property
    def lock_path(self) -> Path:
        """The leadership lock file of the opened topology id."""
        return self.path.with_name(f"{self.path.name}.{quote(self._tid, safe='')}.lock")

    @property
    def _tid(self) -> str:
        if self._topology_id is None:
            raise self._not_open()
        return self._topology_id

    @property
    def _lockfile(self) -> LockFile:
        if self._lock is None:
            self._lock = LockFile(self.lock_path)
        return self._lock

    def open(self, topology_id: str, read_only: bool = False) -> None:
        if not topology_id:
            raise ConfigurationError("the topology id must not be empty")
        if self._conn is not None:
            raise CoordinatorError(f"the state store {self.path} is already open")
        if read_only:
            self._open_read_only(topology_id)
            return
        self._conn = open_writer(self.path)
        self._topology_id = topology_id

    def _open_read_only(self, topology_id: str) -> None:
        known = self.topology_ids()  # raises if there is no such file
        if topology_id not in known:
            raise UnknownTopologyError(topology_id, f"the SQLite state store {self.path}", known)
        self._conn = open_reader(self.path)
        self._topology_id = topology_id

    def preflight(self) -> None:
        check_writable_dir(self.path.parent, "the state directory (--state-dir)")

    def topology_ids(self) -> list[str]:
        with closing(open_reader(self.path)) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if "topology_identity" not in tables:
                return []
            rows = conn.execute("SELECT topology_id FROM topology_identity").fetchall()
        return sorted(r[0] for r in rows)

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        self._fence = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction on the store's connection
        (``coordinators._sqlite.immediate``)."""
        return immediate(self._connection(), self.path)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise self._not_open()
        return self._conn

    def publish_status(self, document: JsonValue) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO runner_status (topology_id, doc) VALUES (?, ?)",
                (self._tid, json.dumps(document)),
            )

    def read_status(self) -> JsonValue | None:
        conn = self._connection()
        try:
            row = conn.execute(
                "SELECT doc FROM runner_status WHERE topology_id = ?", (self._tid,)
            ).fetchone()
        except sqlite3.OperationalError:  # a store made before status documents existed
            return None
        return None if row is None else json.loads(row[0])

    def read_leadership(self) -> Leadership:
        """A runner leads while a process holds the lock file (its lock goes with its
        process, however it ended); the ``fence`` counter, one more for every leadership
        taken (a run's or a rewind's), tells a report from an earlier one by its token."""
        with transaction(self._connection(), self.path, write=False) as conn:
            row = conn.execute(
                "SELECT fence FROM currtx WHERE topology_id = ?", (self._tid,)
            ).fetchone()
        return Leadership(
            held=is_held(self.lock_path),
            token=None if row is None else int(row[0]),
            gone=f"no process holds its lock file {self.lock_path}",
        )

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
        self._check_identity(stored, identity, f"delete the state of {self._tid!r} in {self.path}")

    def acquire_leadership(self, timeout: float | None = None) -> None:
        self._connection()
        lock = self._lockfile
        lock.acquire(timeout, self._held_by)
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
            lock.release()
            raise
        self._fence = int(fence)

    def _held_by(self, holder: str) -> LostLeadershipError:
        return LostLeadershipError(
            f"another runner holds topology {self._tid!r} (lock file {self.lock_path}, held "
            f"by {holder}); stop it or wait for it to finish, or use another --topology-id"
        )

    def check_leadership(self) -> None:
        if self._lock is None or not self._lock.locked or self._fence is None:
            raise self._not_leading()
        if not self._lock.held():
            raise LostLeadershipError(
                f"the lock file {self.lock_path} of topology {self._tid!r} was deleted or "
                "replaced, so another runner may lead it; stop this runner"
            )
        self._connection()
        try:
            # A connection of its own: a committer may call this from the commit thread
            # while the runner's thread is inside a write on the shared one.
            with closing(sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000)) as conn:
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

    def _check_fence(self, conn: sqlite3.Connection, ours: int) -> int:
        """Inside a write transaction: refuse unless we still hold the fence ``ours``;
        return currtx."""
        txid, fence = conn.execute(
            "SELECT txid, fence FROM currtx WHERE topology_id = ?", (self._tid,)
        ).fetchone()
        if fence != ours:
            raise self._taken_over(fence, ours)
        return int(txid)

    def _currtx(self, conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT txid FROM currtx WHERE topology_id = ?", (self._tid,)).fetchone()
        return 1 if row is None else int(row[0])

    def _txid_rows(
        self, conn: sqlite3.Connection, txids: str, txid: int
    ) -> tuple[dict[int, JsonValue], dict[int, dict[int, JsonValue]]]:
        """The stored metadata and partition rows of the txids ``>= txid`` or ``< txid``
        (``txids``), decoded: txid -> metadata, txid -> partition -> metadata."""
        if txids not in (">=", "<"):
            raise ValueError(f"txids: '>=' or '<', not {txids!r}")
        metas = conn.execute(
            f"SELECT txid, meta FROM coordinator_meta WHERE topology_id = ? AND txid {txids} ? "
            "ORDER BY txid",
            (self._tid, txid),
        ).fetchall()
        parts = conn.execute(
            "SELECT txid, partition, meta FROM partition_meta WHERE topology_id = ? "
            f"AND txid {txids} ? ORDER BY txid, partition",
            (self._tid, txid),
        ).fetchall()
        return {t: decode(meta) for t, meta in metas}, _by_txid(parts)

    def read_state(self) -> StoredState:
        with transaction(self._connection(), self.path, write=False) as conn:
            currtx = self._currtx(conn)
            metas, partitions = self._txid_rows(conn, ">=", currtx - 1)
            kept = conn.execute(
                "SELECT txid FROM coordinator_meta WHERE topology_id = ? AND txid < ? "
                "ORDER BY txid",
                (self._tid, currtx - 1),
            ).fetchall()
            digests = (
                conn.execute(
                    "SELECT txid, digest FROM digest WHERE topology_id = ?", (self._tid,)
                ).fetchall()
                if self._has(conn, "digest")  # a read-only look at an older store
                else []
            )
            group = self._group(conn)
            rewinding = self._rewinding(conn)
        return StoredState(
            currtx=currtx,
            metas=metas,
            partitions=partitions,
            digests={txid: decode(digest) for txid, digest in digests},
            group=group,
            kept=tuple(int(t) for (t,) in kept),
            rewinding=rewinding,
        )

    def read_history(self) -> StoredHistory:
        """The kept txids' rows below ``currtx - 1``, read in one snapshot."""
        with transaction(self._connection(), self.path, write=False) as conn:
            metas, partitions = self._txid_rows(conn, "<", self._currtx(conn) - 1)
        return StoredHistory(metas=metas, partitions=partitions)

    @staticmethod
    def _has(conn: sqlite3.Connection, table: str) -> bool:
        """Whether ``table`` exists (a read-only look at a store older than it)."""
        found = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        return found is not None

    def _rewinding(self, conn: sqlite3.Connection) -> int | None:
        if not self._has(conn, "rewind"):
            return None
        row = conn.execute("SELECT txid FROM rewind WHERE topology_id = ?", (self._tid,)).fetchone()
        return None if row is None else int(row[0])

    def _group(self, conn: sqlite3.Connection) -> tuple[int, int] | None:
        if not self._has(conn, "commit_group"):
            return None
        row = conn.execute(
            "SELECT first, last FROM commit_group WHERE topology_id = ?", (self._tid,)
        ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def _started(self, conn: sqlite3.Connection, txid: int) -> bool:
        return (
            conn.execute(
                "SELECT 1 FROM coordinator_meta WHERE topology_id = ? AND txid = ?",
                (self._tid, txid),
            ).fetchone()
            is not None
        )

    def _write_start(self, fence: int, txid: int, meta: str, parts: dict[int, str]) -> None:
        with self._write() as conn:
            self._check_start(txid, self._check_fence(conn, fence), self._started(conn, txid))
            conn.execute(
                "INSERT INTO coordinator_meta (topology_id, txid, meta) VALUES (?, ?, ?)",
                (self._tid, txid, meta),
            )
            try:
                conn.executemany(
                    "INSERT INTO partition_meta (topology_id, txid, partition, meta) "
                    "VALUES (?, ?, ?, ?)",
                    [(self._tid, txid, p, m) for p, m in parts.items()],
                )
            except sqlite3.IntegrityError as exc:
                what = f"partition metadata of txid {txid}"
                raise CoordinatorError(self._already_stored(what)) from exc

    def _write_advance(self, fence: int, txid: int, parts: dict[int, str], first: int) -> None:
        with self._write() as conn:
            currtx = self._check_fence(conn, fence)
            self._check_advance(txid, currtx, first, self._group(conn))
            conn.executemany(
                "INSERT OR REPLACE INTO partition_meta (topology_id, txid, partition, meta) "
                "VALUES (?, ?, ?, ?)",
                [(self._tid, txid, p, m) for p, m in parts.items()],
            )
            conn.execute("UPDATE currtx SET txid = ? WHERE topology_id = ?", (txid + 1, self._tid))
            below = self._kept_below(txid)
            for table in ("coordinator_meta", "partition_meta"):
                conn.execute(
                    f"DELETE FROM {table} WHERE topology_id = ? AND txid < ?", (self._tid, below)
                )
            conn.execute(
                "DELETE FROM digest WHERE topology_id = ? AND txid <= ?", (self._tid, txid)
            )

    def _write_digest(self, fence: int, txid: int, digest: str) -> None:
        with self._write() as conn:
            self._check_digest(txid, self._check_fence(conn, fence), self._started(conn, txid))
            try:
                conn.execute(
                    "INSERT INTO digest (topology_id, txid, digest) VALUES (?, ?, ?)",
                    (self._tid, txid, digest),
                )
            except sqlite3.IntegrityError as exc:
                what = f"the digest of txid {txid}"
                raise CoordinatorError(self._already_stored(what)) from exc

    def _write_group(self, fence: int, first: int, last: int) -> None:
        with self._write() as conn:
            currtx = self._check_fence(conn, fence)
            (started,) = conn.execute(
                "SELECT count(*) FROM coordinator_meta WHERE topology_id = ? AND txid "
                "BETWEEN ? AND ?",
                (self._tid, first, last),
            ).fetchone()
            all_started = started == last - first + 1
            self._check_group(first, last, currtx, all_started, self._group(conn))
            conn.execute(
                "INSERT OR REPLACE INTO commit_group (topology_id, first, last) VALUES (?, ?, ?)",
                (self._tid, first, last),
            )

    def _write_retract(self, fence: int, txid: int) -> None:
        with self._write() as conn:
            self._check_retract(txid, self._check_fence(conn, fence), self._group(conn))
            for table in ("coordinator_meta", "partition_meta", "digest"):
                conn.execute(
                    f"DELETE FROM {table} WHERE topology_id = ? AND txid >= ?", (self._tid, txid)
                )

    def _write_rewind(self, fence: int, txid: int, finish: bool) -> None:
        with self._write() as conn:
            currtx = self._check_fence(conn, fence)
            kept = conn.execute(
                "SELECT txid FROM coordinator_meta WHERE topology_id = ? AND txid < ?",
                (self._tid, currtx),
            ).fetchall()
            rewinding = self._rewinding(conn)
            self._check_rewind(txid, currtx, {int(t) for (t,) in kept}, rewinding, finish)
            if not finish:
                conn.execute(
                    "INSERT OR REPLACE INTO rewind (topology_id, txid) VALUES (?, ?)",
                    (self._tid, txid),
                )
                return
            conn.execute("UPDATE currtx SET txid = ? WHERE topology_id = ?", (txid + 1, self._tid))
            for table in ("coordinator_meta", "partition_meta", "digest"):
                conn.execute(
                    f"DELETE FROM {table} WHERE topology_id = ? AND txid > ?", (self._tid, txid)
                )
            for table in ("commit_group", "rewind"):
                conn.execute(f"DELETE FROM {table} WHERE topology_id = ?", (self._tid,))


def _by_txid(rows: list[tuple[int, int, str]]) -> dict[int, dict[int, JsonValue]]:
    """``(txid, partition, meta)`` rows as txid -> partition -> decoded metadata."""
    partitions: dict[int, dict[int, JsonValue]] = {}
    for txid, partition, meta in rows:
        partitions.setdefault(txid, {})[partition] = decode(meta)
    return partitions
