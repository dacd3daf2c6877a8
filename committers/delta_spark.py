"""The Delta committer's delta-spark path: what ``DeltaCommitter`` writes from the
executors when a table's per-txid sums are too large for the driver
(``max_driver_rows``) or the table has features delta-rs does not write. The same
tables, markers and rules as the delta-rs path (``committers.delta_arrow``): a MERGE per
table carrying the txid marker (``txnAppId``/``txnVersion``), and in opaque mode the
rows stamped from the commit's first txid rebuilt or undone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from committers.delta_sql import (
    OVERFLOW_MARK,
    batch_overflow_error,
    batch_sums,
    checked_sums,
    diagnosed,
    keys_match,
    merge_overflow_error,
    merge_overflows,
    new_value,
)
from committers.tables import CounterTable
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

log = logging.getLogger("committers.delta")

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

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


class SparkWrites:
    """The delta-spark writes of ``DeltaCommitter`` (a mixin: it reads the committer's
    mode, sessions, locations and markers)."""

    # What the committer has (annotations only: nothing here shadows its methods).
    mode: CommitMode
    _sessions: dict[str, Any]
    _key_types: dict[str, dict[str, str]]
    who: Callable[[], str]
    location: Callable[[str], str]
    _spark: Callable[[], Any]
    _app_id: Callable[[str], str]
    _next_version: Callable[[str, tuple[int, int]], tuple[int | None, CommitOutcome]]

    def _spark_sums(
        self,
        attempt: TransactionAttempt,
        input_name: str,
        table: CounterTable,
        inputs: Mapping[str, DataFrame],
    ) -> DataFrame:
        """The sums of a table too large for the driver, checkpointed for the MERGE."""
        sums, bad = batch_sums(inputs[input_name], table, self._key_types[table.name])
        try:
            return checked_sums(sums, bad, table).localCheckpoint(eager=True)
        except Exception as exc:
            if OVERFLOW_MARK not in str(exc):
                raise
            rows = diagnosed(sums.where(bad).limit(5).collect)
            who = self.who()
            raise batch_overflow_error(who, attempt.txid, input_name, table, rows) from exc

    def _spark_group_sums(
        self, table: CounterTable, parts: list[pa.Table | DataFrame]
    ) -> DataFrame:
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

    def _merge_with_spark(
        self, span: tuple[int, int], table: CounterTable, source: DataFrame, done: list[str]
    ) -> CommitOutcome:
        from delta.tables import DeltaTable

        first, txid = span
        version, outcome = self._next_version(table.name, span)
        if version is None:
            return outcome
        spark = self._sessions[table.name]
        keys = {k: f"s.`{k}`" for k in table.keys}
        merge = (
            DeltaTable.forPath(spark, self.location(table.name))
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
            spark.conf.set(TXN_APP_ID_CONF, self._app_id(table.name))
            spark.conf.set(TXN_VERSION_CONF, str(version))
        began = time.perf_counter()
        try:
            merge.execute()
        except Exception as exc:
            if OVERFLOW_MARK not in str(exc):
                raise
            opaque = first if self.mode is CommitMode.OPAQUE else None
            location = self.location(table.name)
            spark = self._spark()
            rows = diagnosed(lambda: merge_overflows(spark, location, source, table, opaque))
            raise merge_overflow_error(self.who(), txid, location, table, rows, done) from exc
        log.debug(
            "merged table=%s txid=%d seconds=%.2f path=delta-spark",
            table.name,
            txid,
            time.perf_counter() - began,
        )
        return outcome

    def _dead_letters_with_spark(self, span: tuple[int, int], rows: DataFrame) -> CommitOutcome:
        first = span[0]
        version, outcome = self._next_version(DEAD_LETTERS_TABLE, span)
        if version is None:
            return outcome
        writer = rows.write.format("delta")
        if version != UNMARKED:
            writer = writer.option("txnAppId", self._app_id(DEAD_LETTERS_TABLE))
            writer = writer.option("txnVersion", version)
        if self.mode is CommitMode.OPAQUE:
            # Replace this txid's rows in the same commit, so a replay whose bad records
            # differ leaves exactly its own.
            writer = writer.mode("overwrite").option("replaceWhere", f"txid >= {first}")
        else:
            writer = writer.mode("append")
        writer.save(self.location(DEAD_LETTERS_TABLE))
        return outcome


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
