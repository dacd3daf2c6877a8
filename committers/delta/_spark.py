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
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from committers._sums import batch_sums
from committers.delta._location import sql_name
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
from committers.delta._target import DEAD_LETTERS_TABLE, DeltaTarget, log_merged
from committers.tables import CounterTable
from transactional.errors import ConfigurationError
from transactional.spark.checkpoints import checkpoint
from transactional.spark.connect import clone_session, is_connect, reopen_if_lost, stop_session
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

log = logging.getLogger("committers.delta")

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
#: A commit's ``userMetadata`` (``DeltaTarget.note``) for the session's writes.
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
#: ``_next_version``: write, but with no marker (an unchecked commit of a txid the table
#: already marks a later one of: delta-spark skips a write whose txn version it has seen).
UNMARKED = -1
MATERIALIZE_SOURCE_CONF = "spark.databricks.delta.merge.materializeSource"

#: A commit group's part (its index) and value, when its parts are combined in Spark.
_PART, _PART_VALUE = "__transactional_part", "__transactional_part_value"

#: Spark sessions are cheap views of one SparkContext, each with its own SQL conf.
#: The txn confs are session-wide and MERGE has no per-call option for them, so every
#: table gets a session of its own: no other code's write on the runner's session (and
#: no other committer's) can pick up our marker, and no lock is needed.
SCOPED_CONF = {
    # The source is a checkpointed, summed batch: Delta's own copy of it is waste. (On
    # Spark Connect it is a persisted frame instead, which Delta must copy: ``open``.)
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
        self._connect = False  # the sessions are Spark Connect's (known at open)
        self._claimed: dict[str, int] = {}  # table -> the fence token it was claimed with

    def open(self, spark: Any, tables: list[str]) -> None:
        self._connect = is_connect(spark)
        for table in tables:
            if self._connect:
                # A clone of the session on the server (sessions there share global
                # temporary views, as a classic session's siblings do). The sums there
                # are persisted (``checkpoint``: a released local checkpoint's blocks
                # stay on the server until its JVM collects them), and Delta refuses a
                # cached MERGE source it did not copy; its copy is unpersisted by Delta
                # when the MERGE ends, the sums by ``merge``.
                conf = {**SCOPED_CONF, MATERIALIZE_SOURCE_CONF: "all"}
                self._sessions[table] = clone_session(spark, conf)
                continue
            session = self._sessions[table] = spark.newSession()
            for key, value in SCOPED_CONF.items():
                session.conf.set(key, value)

    def close(self) -> None:
        sessions = list(self._sessions.values())
        self._sessions.clear()
        self._claimed.clear()
        if self._connect:
            for session in sessions:
                stop_session(session)

    def _session(self, table: str) -> Any:
        """``table``'s own session; on Connect reopened first if its server was
        restarted, with its settings (``reopen_if_lost``), as the runner's is."""
        session = self._sessions[table]
        if self._connect:
            reopen_if_lost(session)
        return session

    def claim(self, table: str) -> None:
        """``DriverWriter.claim`` for a table delta-rs does not write: the fence token
        put in it by an empty delta-spark append marked with it."""
        token = self._target.context().fence_token
        if token is None or self._claimed.get(table) == token:
            return
        location, fence = self._location(table), self._target.fence_id(table)
        held = latest_marker(location, fence)
        self._target.check_fence(held, table)
        if held != token:
            spark = self._session(table) if table in self._sessions else None
            spark = spark or self._target.context().spark
            if spark is None:
                raise ConfigurationError(f"{self._target.who()} needs the runner's SparkSession")
            empty = spark.read.format("delta").load(location).limit(0)
            writer = empty.write.format("delta").option("txnAppId", fence)
            writer = _noted(writer.option("txnVersion", token), self._target.note())
            writer.mode("append").save(location)
        self._claimed[table] = token

    def sums(
        self,
        attempt: TransactionAttempt,
        input_name: str,
        table: CounterTable,
        frame: DataFrame,
        key_types: dict[str, str],
    ) -> DataFrame:
        """The sums of a table too large for the driver (``frame``: the batch's input
        ``input_name``; ``key_types``: the table's), computed now and kept for the MERGE
        (``transactional.checkpoint``)."""
        sums, bad = batch_sums(frame, table, key_types)
        try:
            return checkpoint(checked_sums(sums, bad, table), eager=True)
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

        spark = self._session(table.name)
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
        return checkpoint(checked_sums(sums, bad, spec), eager=True)

    def merge(
        self, span: tuple[int, int], table: CounterTable, source: DataFrame, done: list[str]
    ) -> CommitOutcome:
        """``source`` (a span's checkpointed per-key sums) merged into ``table``'s Delta
        table by delta-spark, with the span's marker; skipped if the table holds the
        span (``done``: the tables of this commit written before, for the error of a sum
        that cannot be stored)."""
        first, txid = span
        version, outcome = self._next_version(table.name, span)
        if version is None:
            return outcome
        spark = self._session(table.name)
        # The sums are the runner session's; the MERGE runs in the table's own session,
        # which reads them through a global temporary view (seen by every session of
        # one Spark application, on Connect too, where sessions share no frames).
        view = f"transactional_sums_{uuid.uuid4().hex}"
        statement = merge_statement(
            self._location(table.name), f"global_temp.{view}", table, self.mode, span
        )
        # This session is this table's alone (see SCOPED_CONF), used by the commit
        # thread for this MERGE only: the marker cannot reach another write.
        if version == UNMARKED:
            spark.conf.unset(TXN_APP_ID_CONF)
            spark.conf.unset(TXN_VERSION_CONF)
        else:
            spark.conf.set(TXN_APP_ID_CONF, self._target.app_id(table.name))
            spark.conf.set(TXN_VERSION_CONF, str(version))
        note = self._target.note()
        if note is None:
            spark.conf.unset(USER_METADATA_CONF)
        else:
            spark.conf.set(USER_METADATA_CONF, note)
        began = time.perf_counter()
        source.createOrReplaceGlobalTempView(view)
        try:
            spark.sql(statement).collect()
        except Exception as exc:
            if OVERFLOW_MARK not in str(exc):
                raise
            opaque = first if self.mode is CommitMode.OPAQUE else None
            location = self._location(table.name)
            runner = self._target.context().spark
            rows = diagnosed(lambda: merge_overflows(runner, location, source, table, opaque))
            raise self._target.overflow(txid, table, rows, done) from exc
        finally:
            spark.catalog.dropGlobalTempView(view)
            _free(source)
        log_merged("delta-spark", table.name, txid, began)
        return outcome

    def dead_letters(self, span: tuple[int, int], rows: DataFrame) -> CommitOutcome:
        """The span's dead letters appended (opaque: its earlier rows replaced) by
        delta-spark, with the span's marker; skipped if the table holds the span."""
        first = span[0]
        version, outcome = self._next_version(DEAD_LETTERS_TABLE, span)
        if version is None:
            return outcome
        writer = _noted(rows.write.format("delta"), self._target.note())
        if version != UNMARKED:
            writer = writer.option("txnAppId", self._target.app_id(DEAD_LETTERS_TABLE))
            writer = writer.option("txnVersion", version)
        if self.mode is CommitMode.OPAQUE:
            # Replace this txid's rows in the same commit, so a replay whose bad records
            # differ leaves exactly its own.
            writer = writer.mode("overwrite").option("replaceWhere", f"txid >= {first}")
        else:
            writer = writer.mode("append")
        try:
            writer.save(self._location(DEAD_LETTERS_TABLE))
        finally:
            _free(rows)
        return outcome

    def _next_version(self, table: str, span: tuple[int, int]) -> tuple[int | None, CommitOutcome]:
        """The marker version to write for ``span`` (None: already holds it, skip)."""
        self._target.check_fence(
            latest_marker(self._location(table), self._target.fence_id(table)), table
        )
        recorded = latest_marker(self._location(table), self._target.app_id(table))
        where = f"Delta table {self._location(table)}"
        checked = self._target.context().checked
        version, outcome = next_marker(recorded, span, self.mode, where, checked)
        if version is not None and recorded is not None and version <= recorded:
            # Unchecked, and the table holds a later txid: written without a marker, as
            # delta-spark would skip a write whose txn version it has seen.
            return UNMARKED, outcome
        return version, outcome


def _noted(writer: Any, note: str | None) -> Any:
    """``writer`` (a ``DataFrameWriter``) whose commit carries ``note`` as its
    ``userMetadata`` (``DeltaTarget.note``), when there is one."""
    return writer if note is None else writer.option("userMetadata", note)


def _free(frame: DataFrame) -> None:
    """On Spark Connect, ``frame`` (kept by ``checkpoint``) unpersisted once written: a
    commit's group sums are made outside any attempt, whose end would free them. It
    stays readable (recomputed), should the commit be retried. On a classic session
    a local checkpoint, left to the attempt's release."""
    if is_connect(frame.sparkSession):
        frame.unpersist(blocking=False)


def merge_statement(
    location: str, source: str, table: CounterTable, mode: CommitMode, span: tuple[int, int]
) -> str:
    """The SQL ``MERGE`` of ``source`` (a span's per-key sums, ``inc``, by the table's
    keys) into the Delta table at ``location``: in transactional mode each key's value
    folded with its sum; in opaque mode also stamped with the span's last txid, the
    rows an earlier attempt of the span wrote rebuilt from ``prev`` or undone. SQL, not
    delta-spark's Python builder: a Spark Connect server runs it without Delta's own
    Connect plugin."""
    first, txid = span
    value = table.column
    stored = f"t.`{value}`"
    null = f"CAST(NULL AS {table.declared.sql})"
    names = [*table.keys, value]
    inserted = [f"s.`{k}`" for k in table.keys] + ["s.inc"]
    if mode is CommitMode.TRANSACTIONAL:
        clauses = [
            f"WHEN MATCHED THEN UPDATE SET `{value}` = {new_value(stored, table)}",
        ]
    else:
        names += ["prev", "txid"]
        inserted += [null, str(txid)]
        clauses = [
            # Rows these txids wrote before: rebuilt from prev (null: they created it).
            f"WHEN MATCHED AND t.txid >= {first} THEN UPDATE SET "
            f"`{value}` = {new_value('t.prev', table)}",
            f"WHEN MATCHED AND t.txid < {first} THEN UPDATE SET prev = {stored}, "
            f"`{value}` = {new_value(stored, table)}, txid = {txid}",
        ]
    columns = ", ".join(f"`{n}`" for n in names)
    clauses.append(f"WHEN NOT MATCHED THEN INSERT ({columns}) VALUES ({', '.join(inserted)})")
    if mode is CommitMode.OPAQUE:
        clauses += [
            # Rows an earlier attempt wrote that this attempt no longer has.
            f"WHEN NOT MATCHED BY SOURCE AND t.txid >= {first} AND t.prev IS NULL THEN DELETE",
            f"WHEN NOT MATCHED BY SOURCE AND t.txid >= {first} THEN UPDATE SET "
            f"`{value}` = t.prev, prev = {null}, txid = 0",
        ]
    target = sql_name(location)
    return f"MERGE INTO {target} AS t USING {source} AS s ON {keys_match(table.keys)} " + " ".join(
        clauses
    )


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
