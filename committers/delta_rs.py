"""The Delta committer's delta-rs path: what ``DeltaCommitter`` writes from the driver
when a table's per-txid sums fit ``max_driver_rows`` (the common case). The MERGE and
the dead-letter write with their txid markers are ``committers.delta_arrow``'s; this
mixin keeps each table open and decides the marker of a commit, as ``delta_spark``'s
``SparkWrites`` does for the executors' path.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from committers.delta_arrow import (
    Unstorable,
    combined_sums,
    merge_counts,
    write_dead_letters,
)
from committers.delta_parquet import arrow_writable
from committers.delta_spark import DEAD_LETTERS_TABLE
from committers.delta_sql import batch_overflow_error, merge_overflow_error
from committers.snapshot import next_marker
from committers.tables import CounterTable
from transactional.committer import CommitterContext
from transactional.types import CommitMode, CommitOutcome

log = logging.getLogger("committers.delta")

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa
    from pyspark.sql import DataFrame


class ArrowWrites:
    """The delta-rs writes of ``DeltaCommitter`` (a mixin: it reads the committer's
    mode, locations and markers). Each table's ``DeltaTable`` is loaded once, at open,
    and caught up with the commits since (its own and any other writer's) before each
    commit: loading replays the table's log (30 ms at 40 commits, growing until a
    checkpoint), catching up reads only the new entries (5 ms)."""

    # What the committer has (annotations only: nothing here shadows its methods).
    mode: CommitMode
    who: Callable[[], str]
    location: Callable[[str], str]
    _context: Callable[[], CommitterContext]
    _app_id: Callable[[str], str]
    _tables: Callable[[], list[str]]
    _loaded: dict[str, Any]  # table -> its delta-rs DeltaTable, kept open
    _by_driver: dict[str, bool]  # table -> delta-rs may write it
    _spark_group_sums: Callable[[CounterTable, list[pa.Table | DataFrame]], DataFrame]

    def _load_tables(self) -> None:
        """Load every table; one with features delta-rs does not write goes to delta-spark."""
        from deltalake import DeltaTable

        for name in self._tables():
            dt = self._loaded[name] = DeltaTable(self.location(name))
            writable = arrow_writable(dt)
            if not writable:
                log.info(
                    "table=%s has table features delta-rs does not write: committed "
                    "through delta-spark",
                    self.location(name),
                )
            self._by_driver[name] = writable

    def _group_sums(
        self,
        span: tuple[int, int],
        input_name: str,
        table: CounterTable,
        parts: list[pa.Table | DataFrame],
    ) -> pa.Table | DataFrame | None:
        """A commit group's sums of ``table``, added per key exactly on the driver
        (``combined_sums``); in Spark if one txid's were too large for it."""
        import pyarrow as pa

        if not parts:
            return None
        if all(isinstance(p, pa.Table) for p in parts):
            try:
                return combined_sums(parts, table)
            except Unstorable as exc:
                rows = [{**key, "inc": inc} for key, _, inc in exc.rows]
                txids = f"{span[0]}..{span[1]}"
                raise batch_overflow_error(self.who(), txids, input_name, table, rows) from None
        return self._spark_group_sums(table, parts)

    def _merge_with_arrow(
        self, span: tuple[int, int], table: CounterTable, source: pa.Table | None, done: list[str]
    ) -> CommitOutcome:
        txid = span[1]
        dt, marker, outcome = self._arrow_marker(table.name, span)
        if marker is None:
            return outcome
        began = time.perf_counter()
        try:
            merge_counts(dt, table, source, span, self.mode, marker)
        except Unstorable as exc:
            rows = [{**key, "stored": stored, "inc": inc} for key, stored, inc in exc.rows]
            location = self.location(table.name)
            raise merge_overflow_error(self.who(), txid, location, table, rows, done) from None
        log.debug(
            "merged table=%s txid=%d rows=%d seconds=%.3f path=delta-rs",
            table.name,
            txid,
            0 if source is None else source.num_rows,
            time.perf_counter() - began,
        )
        return outcome

    def _dead_letters_with_arrow(
        self, span: tuple[int, int], rows: pa.Table | None
    ) -> CommitOutcome:
        dt, marker, outcome = self._arrow_marker(DEAD_LETTERS_TABLE, span)
        if marker is not None:
            write_dead_letters(dt, rows, span[0], self.mode, marker)
        return outcome

    def _arrow_marker(
        self, table: str, span: tuple[int, int]
    ) -> tuple[Any, tuple[str, int] | None, CommitOutcome]:
        """The table, caught up; the marker ``(app id, version)`` a commit of ``span``
        writes to it (None: it holds the txids already, skip) and the outcome."""
        dt = self._loaded.get(table)
        if dt is None:  # not opened (or closed): load it now
            from deltalake import DeltaTable

            dt = self._loaded[table] = DeltaTable(self.location(table))
        else:
            dt.update_incremental()
        app_id = self._app_id(table)
        location = f"Delta table {self.location(table)}"
        recorded = dt.transaction_version(app_id)
        checked = self._context().checked
        version, outcome = next_marker(recorded, span, self.mode, location, checked)
        return dt, None if version is None else (app_id, version), outcome
