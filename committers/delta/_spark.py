"""The Delta committer's delta-spark path: ``ExecutorWriter`` writes from the executors
what a table's per-txid sums are too large for the driver (``max_driver_rows``), or a
table with features delta-rs does not write. The same
tables, markers and rules as the delta-rs path (``committers.delta._arrow``): a MERGE per
table carrying the txid marker (``txnAppId``/``txnVersion``), and in opaque mode the
rows stamped from the commit's first txid rebuilt or undone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from committers._sums import batch_sums
from committers.delta._snapshot import latest_marker, next_marker
from committers.delta._sql import (
    OVERFLOW_MARK,
    batch_overflow_error,
    checked_sums,
    diagnosed,
    keys_match,
    merge_overflows,
    new_value,
)
from committers.delta._target import DeltaTarget, log_merged
from committers.tables import CounterTable
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

log = logging.getLogger("committers.delta")

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
#: ``_next_version``: write, but with no marker (an unchecked commit of a txid the table
#: already marks a later one of: delta-spark skips a write whose txn version it has seen).
UNMARKED = -1
MATERIALIZE_SOURCE_CONF = "spark.databricks.delta.merge.materializeSource"
DEAD_LETTERS_TABLE = "dead_letters"

#: A commit group's part (its index) and value, when its parts are combined in Spark.
_PART, _PART_VALUE = "__transactional_part", "__transactional_part_value"

#: Spark sessions are cheap views of one SparkContext, each with its own SQL conf.
#: The txn confs are session-wide and MERGE has no per-call option for them, so every
#: table gets a session of its own: no other code's write on the runner's session (and
#: no other committer's) can pick up our marker, and no lock is needed.
SCOPED_CONF = {
    # The source is a checkpointed, summed batch: Delta's own copy of it is waste.
    MATERIALIZE_SOURCE_CONF: "none",
    # decimal(38,s) + decimal(38,s) keeps its s decimals (the default drops one); the
    # sums are try_add/try_cast anyway, so an overflow is a null, never a rounding.
    "spark.sql.decimalOperations.allowPrecisionLoss": "false",
    "spark.sql.storeAssignmentPolicy": "ANSI",
}


class ExecutorWriter:
    """The delta-spark writes of a Delta committer, and the sums they merge: each table
    is written through a Spark session of its own (``SCOPED_CONF``), made at open."""

    def __init__(self, target: DeltaTarget) -> None:
        self.mode = target.mode
        self._target = target
        self._location = target.location
        self._sessions: dict[str, Any] = {}  # table -> its own session (see SCOPED_CONF)

    def open(self, spark: Any, tables: list[str]) -> None:
        for table in tables:
            session = spark.newSession()
            for key, value in SCOPED_CONF.items():
                session.conf.set(key, value)
            self._sessions[table] = session

    def close(self) -> None:
        self._sessions.clear()

    def sums(
        self,
        attempt: TransactionAttempt,
        input_name: str,
        table: CounterTable,
        frame: DataFrame,
        key_types: dict[str, str],
    ) -> DataFrame:
        """The sums of a table too large for the driver (``frame``: the batch's input
        ``input_name``; ``key_types``: the table's), checkpointed for the MERGE."""
        sums, bad = batch_sums(frame, table, key_types)
        try:
            return checked_sums(sums, bad, table).localCheckpoint(eager=True)
        except Exception as exc:
            if OVERFLOW_MARK not in str(exc):
                raise
            rows = diagnosed(sums.where(bad).limit(5).collect)
            who = self._target.who()
            raise batch_overflow_error(who, attempt.txid, input_name, table, rows) from exc

    def group_sums(self, table: CounterTable, parts: list[pa.Table | DataFrame]) -> DataFrame:
        """A group's sums of a table one of whose txids was merged by delta-spark: every
        part as a frame, summed again in Spark (exactly, as ``batch_sums`` does)."""
        import pyarrow as pa
        from pyspark.sql import functions as F

        spark = self._sessions[table.name]
        frames = [spark.createDataFrame(p) if isinstance(p, pa.Table) else p for p in parts]
        # Each part's values, re-aggregated by how the table combines two values: counts
        # added, and for ``last`` the later txid's (the part's index as the order).
        spec = replace(
            table,
            value=_PART_VALUE,
            aggregate=table.combine,
            order_by=_PART if table.combine == "last" else None,
        )
        union = None
        for i, frame in enumerate(frames):
            frame = frame.withColumnRenamed("inc", _PART_VALUE).withColumn(_PART, F.lit(i))
            union = frame if union is None else union.unionByName(frame)
        assert union is not None
        key_types = {k: union.schema[k].dataType.simpleString() for k in table.keys}
        sums, bad = batch_sums(union, spec, key_types)
        return checked_sums(sums, bad, spec).localCheckpoint(eager=True)

    def merge(
        self, span: tuple[int, int], table: CounterTable, source: DataFrame, done: list[str]
    ) -> CommitOutcome:
        """``source`` (a span's checkpointed per-key sums) merged into ``table``'s Delta
        table by delta-spark, with the span's marker; skipped if the table holds the
        span (``done``: the tables of this commit written before, for the error of a sum
        that cannot be stored)."""
        from delta.tables import DeltaTable

        first, txid = span
        version, outcome = self._next_version(table.name, span)
        if version is None:
            return outcome
        spark = self._sessions[table.name]
        keys = {k: f"s.`{k}`" for k in table.keys}
        merge = (
            DeltaTable.forPath(spark, self._location(table.name))
            .alias("t")
            .merge(source.alias("s"), keys_match(table.keys))
        )
        null = f"CAST(NULL AS {table.declared.sql})"
        value = table.column
        stored = f"t.`{value}`"
        if self.mode is CommitMode.TRANSACTIONAL:
            merge = merge.whenMatchedUpdate(set={value: new_value(stored, table)})
            merge = merge.whenNotMatchedInsert(values={**keys, value: "s.inc"})
        else:
            t, f = str(txid), str(first)
            merge = (
                # Rows these txids wrote before: rebuild from prev (null: they created it).
                merge.whenMatchedUpdate(
                    condition=f"t.txid >= {f}", set={value: new_value("t.prev", table)}
                )
                .whenMatchedUpdate(
                    condition=f"t.txid < {f}",
                    set={"prev": stored, value: new_value(stored, table), "txid": t},
                )
                .whenNotMatchedInsert(values={**keys, value: "s.inc", "prev": null, "txid": t})
                # Rows an earlier attempt wrote that this attempt no longer has.
                .whenNotMatchedBySourceDelete(condition=f"t.txid >= {f} AND t.prev IS NULL")
                .whenNotMatchedBySourceUpdate(
                    condition=f"t.txid >= {f}",
                    set={value: "t.prev", "prev": null, "txid": "0"},
                )
            )
        # This session is this table's alone (see SCOPED_CONF), used by the commit
        # thread for this MERGE only: the marker cannot reach another write.
        if version == UNMARKED:
            spark.conf.unset(TXN_APP_ID_CONF)
            spark.conf.unset(TXN_VERSION_CONF)
        else:
            spark.conf.set(TXN_APP_ID_CONF, self._target.app_id(table.name))
            spark.conf.set(TXN_VERSION_CONF, str(version))
        began = time.perf_counter()
        try:
            merge.execute()
        except Exception as exc:
            if OVERFLOW_MARK not in str(exc):
                raise
            opaque = first if self.mode is CommitMode.OPAQUE else None
            location = self._location(table.name)
            runner = self._target.context().spark
            rows = diagnosed(lambda: merge_overflows(runner, location, source, table, opaque))
            raise self._target.overflow(txid, table, rows, done) from exc
        log_merged("delta-spark", table.name, txid, began)
        return outcome

    def dead_letters(self, span: tuple[int, int], rows: DataFrame) -> CommitOutcome:
        """The span's dead letters appended (opaque: its earlier rows replaced) by
        delta-spark, with the span's marker; skipped if the table holds the span."""
        first = span[0]
        version, outcome = self._next_version(DEAD_LETTERS_TABLE, span)
        if version is None:
            return outcome
        writer = rows.write.format("delta")
        if version != UNMARKED:
            writer = writer.option("txnAppId", self._target.app_id(DEAD_LETTERS_TABLE))
            writer = writer.option("txnVersion", version)
        if self.mode is CommitMode.OPAQUE:
            # Replace this txid's rows in the same commit, so a replay whose bad records
            # differ leaves exactly its own.
            writer = writer.mode("overwrite").option("replaceWhere", f"txid >= {first}")
        else:
            writer = writer.mode("append")
        writer.save(self._location(DEAD_LETTERS_TABLE))
        return outcome

    def _next_version(self, table: str, span: tuple[int, int]) -> tuple[int | None, CommitOutcome]:
        """The marker version to write for ``span`` (None: already holds it, skip)."""
        recorded = latest_marker(self._location(table), self._target.app_id(table))
        where = f"Delta table {self._location(table)}"
        checked = self._target.context().checked
        version, outcome = next_marker(recorded, span, self.mode, where, checked)
        if version is not None and recorded is not None and version <= recorded:
            # Unchecked, and the table holds a later txid: written without a marker, as
            # delta-spark would skip a write whose txn version it has seen.
            return UNMARKED, outcome
        return version, outcome


def concat(parts: list[pa.Table | DataFrame]) -> pa.Table | DataFrame | None:
    """A group's dead letters, each row with its own txid: one Arrow table, or one
    Spark frame if any txid had more than the driver takes."""
    import pyarrow as pa

    if not parts:
        return None
    if all(isinstance(p, pa.Table) for p in parts):
        return pa.concat_tables(parts, promote_options="default")
    frames = [p for p in parts if not isinstance(p, pa.Table)]
    spark = frames[0].sparkSession
    union = None
    for part in parts:
        frame = spark.createDataFrame(part) if isinstance(part, pa.Table) else part
        union = frame if union is None else union.unionByName(frame)
    return union
