"""The Delta committer's delta-rs path: ``DriverWriter`` writes from the driver what a
table's per-txid sums fit ``max_driver_rows`` (the common case). The MERGE and the
dead-letter write with their txid markers are ``committers.delta._arrow``'s; the writer
keeps each table open and decides the marker of a commit, as
``committers.delta._spark.ExecutorWriter`` does for the executors' path.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from committers.delta._arrow import (
    Unstorable,
    commit_properties,
    merge_counts,
    write_dead_letters,
)
from committers.delta._location import local_dir
from committers.delta._parquet import arrow_schema, arrow_writable
from committers.delta._snapshot import next_marker
from committers.delta._target import DEAD_LETTERS_TABLE, DeltaTarget, log_merged
from committers.tables import CounterTable
from transactional.types import CommitOutcome

log = logging.getLogger("committers.delta")

if TYPE_CHECKING:
    import pyarrow as pa


class DriverWriter:
    """The delta-rs writes of a Delta committer, one per commit of a table. Each table's
    ``DeltaTable`` is loaded once, at open, and caught up with the commits since (its
    own and any other writer's) before each commit: loading replays the table's log
    (30 ms at 40 commits, growing until a checkpoint), catching up reads only the new
    entries. A local table is caught up only when a commit after the loaded version
    exists (``_caught_up``)."""

    def __init__(self, target: DeltaTarget) -> None:
        self.mode = target.mode
        self._target = target
        self._location = target.location
        self._loaded: dict[str, Any] = {}  # table -> its delta-rs DeltaTable, kept open
        self._writable: dict[str, bool] = {}  # table -> delta-rs may write it
        self._claimed: dict[str, int] = {}  # table -> the fence token it was claimed with

    def open(self) -> None:
        """Load every table; one with features delta-rs does not write is left to
        delta-spark (``writes``)."""
        from deltalake import DeltaTable

        for name in self._target.names:
            dt = self._loaded[name] = DeltaTable(self._location(name))
            writable = arrow_writable(dt)
            if not writable:
                log.info(
                    "table=%s has table features delta-rs does not write: committed "
                    "through delta-spark",
                    self._location(name),
                )
            self._writable[name] = writable

    def writes(self, table: str) -> bool:
        """Whether this writer may write ``table`` (known once open)."""
        return self._writable[table]

    def close(self) -> None:
        self._loaded.clear()
        self._claimed.clear()

    def claim(self, table: str) -> None:
        """Before this leadership's first write to ``table``: refuse it if a later
        leader claimed it (``FencedError``), else put this runner's fence token in it
        (an empty commit carrying the token as an app transaction), so that a deposed
        leader resuming after this one claimed the table finds a token above its own
        before it writes. One whose commit was under way when the table was claimed is
        refused by Delta's conflict check: its commit and this leader's carry the same
        txid marker's app id."""
        from deltalake import write_deltalake

        token = self._target.context().fence_token
        if token is None or self._claimed.get(table) == token:
            return
        dt = self._caught_up(table)
        fence = self._target.fence_id(table)
        held = dt.transaction_version(fence)
        self._target.check_fence(held, table)
        if held != token:
            marked = commit_properties((fence, token), self._target.note())
            empty = arrow_schema(dt).empty_table()
            write_deltalake(dt, empty, mode="append", commit_properties=marked)
            log.info("claimed table=%s fence=%d", self._location(table), token)
        self._claimed[table] = token

    def merge(
        self, span: tuple[int, int], table: CounterTable, source: pa.Table | None, done: list[str]
    ) -> CommitOutcome:
        """``source`` (a span's per-key sums) merged into ``table``'s Delta table, with
        the span's marker; skipped if the table holds the span (``done``: the tables of
        this commit written before, for the error of a sum that cannot be stored)."""
        txid = span[1]
        dt, marker, outcome = self._marker(table.name, span)
        if marker is None:
            return outcome
        began = time.perf_counter()
        try:
            merge_counts(dt, table, source, span, self.mode, marker, self._target.note())
        except Unstorable as exc:
            rows = [{**key, "stored": stored, "inc": inc} for key, stored, inc in exc.rows]
            raise self._target.overflow(txid, table, rows, done) from None
        log_merged("delta-rs", table.name, txid, began, 0 if source is None else source.num_rows)
        self._compact(table.name, dt)
        return outcome

    def dead_letters(self, span: tuple[int, int], rows: pa.Table | None) -> CommitOutcome:
        """The span's dead letters appended (opaque: its earlier rows replaced), with the
        span's marker; skipped if the table holds the span."""
        dt, marker, outcome = self._marker(DEAD_LETTERS_TABLE, span)
        if marker is not None:
            write_dead_letters(dt, rows, span[0], self.mode, marker, self._target.note())
            self._compact(DEAD_LETTERS_TABLE, dt)
        return outcome

    def _compact(self, table: str, dt: Any) -> None:
        """Bin-pack the table's small files into few (delta-rs' OPTIMIZE) once it holds
        more than ``compact_files``. A commit that adds keys adds a file, so without
        this a table of thousands of small txids holds thousands of files, and each
        commit's read of the rows its keys may match (``target_rows``), and every
        reader's, grows with them. Compaction rewrites rows, never changes them: it
        keeps every txid marker, and time travel to a version before it still reads that
        version's files. It is its own Delta commit, after the txid's; if it fails (a
        conflict with another writer), the txid stays committed and a later commit
        compacts."""
        from deltalake.exceptions import DeltaError

        limit = self._target.compact_files
        if not limit:
            return
        files = len(dt.file_uris())
        if files <= limit:
            return
        began = time.perf_counter()
        try:
            done = dt.optimize.compact()
        except DeltaError as exc:
            log.warning(
                "compaction failed table=%s files=%d error=%s: left for a later commit",
                self._location(table),
                files,
                exc,
            )
            return
        log.info(
            "compacted table=%s files_removed=%d files_added=%d seconds=%.3f",
            self._location(table),
            done["numFilesRemoved"],
            done["numFilesAdded"],
            time.perf_counter() - began,
        )

    def _caught_up(self, table: str) -> Any:
        """The table's ``DeltaTable``, at its latest version.

        On a local file system delta-rs finds the commits after the loaded version by
        listing the table's whole log directory (the local store lists no range), and a
        log keeps every commit for 30 days: catching up took 6 ms at 1,000 versions and
        18 ms at 3,500, per table and txid, so a run slowed as its tables aged. Whether
        there is anything to catch up with is one file's existence (the next version's
        commit, which every writer creates): asked first, the log is listed only when
        another writer has committed. A commit landing after the question meets
        delta-rs's conflict check when ours commits, as one landing after a listing
        does. A table in S3 is left to delta-rs (its listing there not measured)."""
        dt = self._loaded.get(table)
        if dt is None:  # not opened (or closed): load it now
            from deltalake import DeltaTable

            dt = self._loaded[table] = DeltaTable(self._location(table))
        elif self._may_be_behind(table, dt.version()):
            dt.update_incremental()
        return dt

    def _may_be_behind(self, table: str, version: int) -> bool:
        """Whether ``table`` may hold a commit after ``version``: a local table's next
        commit file exists; a table in S3, always (delta-rs asks the store)."""
        local = local_dir(self._location(table))
        if local is None:
            return True
        return (local / "_delta_log" / f"{version + 1:020d}.json").exists()

    def _marker(
        self, table: str, span: tuple[int, int]
    ) -> tuple[Any, tuple[str, int] | None, CommitOutcome]:
        """The table, caught up; the marker ``(app id, version)`` a commit of ``span``
        writes to it (None: it holds the txids already, skip) and the outcome."""
        dt = self._caught_up(table)
        self._target.check_fence(dt.transaction_version(self._target.fence_id(table)), table)
        app_id = self._target.app_id(table)
        location = f"Delta table {self._location(table)}"
        recorded = dt.transaction_version(app_id)
        checked = self._target.context().checked
        version, outcome = next_marker(recorded, span, self.mode, location, checked)
        return dt, None if version is None else (app_id, version), outcome
