"""Counters and dead letters in Delta Lake tables, one MERGE or write per table per commit.

Both modes record the txid in Delta's own idempotent-write marker (a ``SetTransaction``
action: app id -> version), which is written in the same atomic commit as the data and
read back from the table's snapshot. Transactional mode uses the txid as the version, so
Delta itself skips a replay. Opaque mode must be able to write the same txid again, so
its version is ``txid * ATTEMPT_SLOTS + n`` (n counts rewrites of that txid): it still
grows strictly, and ``version // ATTEMPT_SLOTS`` is the txid the table holds.

Fencing a deposed leader: Delta's commits are atomic and its conflict detection refuses
a write that raced another on the same table, but a table cannot compare a fence token
inside a MERGE the way the Redis script does. So the committer checks the runner still
leads right before each table's write (``CommitterContext.check_leadership``), and what
Delta guarantees against a leader that is paused *between* that check and the write is:
in transactional mode, nothing can go wrong (a txid's rows follow from its stored
metadata, and the txn marker makes a second write of a txid a no-op); in opaque mode,
a leader paused in exactly that window may, when it resumes, rewrite the txid it was
committing over its successor's rewrite of it, in that one table. Where leaders can be
paused for longer than their store session, prefer the Redis committer (fenced inside
its script) for opaque spouts.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from committers.base import CounterCommitter, CounterTable
from transactional.committer import CommitterContext
from transactional.errors import CommitError, ConfigurationError, TransactionalError
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("committers.delta")

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
MATERIALIZE_SOURCE_CONF = "spark.databricks.delta.merge.materializeSource"
ATTEMPT_SLOTS = 1_000_000
DEAD_LETTERS_TABLE = "dead_letters"

#: Spark sessions are cheap views of one SparkContext, each with its own SQL conf.
#: The txn confs are session-wide and MERGE has no per-call option for them, so every
#: table gets a session of its own: no other code's write on the runner's session (and
#: no other committer's) can pick up our marker, and no lock is needed.
_SCOPED_CONF = {
    # The source is a checkpointed, summed batch: Delta's own copy of it is waste.
    MATERIALIZE_SOURCE_CONF: "none",
}


#: Where Delta's jars are resolved (by Spark, from Maven Central) and then loaded from.
DEFAULT_IVY_DIR = Path.home() / ".cache" / "transactional" / "ivy"


def delta_spark_conf(ivy_dir: str | Path | None = None) -> dict[str, str]:
    """Spark settings that load Delta; pass them to ``create_spark_session``.

    The Maven coordinate follows ``delta.pip_utils.configure_spark_with_delta_pip``
    (artifact suffixed with pyspark's major.minor), but as plain conf so it can be merged
    with other settings and used by any session builder.
    """
    import pyspark

    delta_version = importlib.metadata.version("delta-spark")
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    package = f"io.delta:delta-spark_{spark_minor}_2.13:{delta_version}"
    # Resolve into a cache of our own: once Delta's jars are there, load them directly
    # instead of asking Ivy again (which prints a resolution report on every start).
    ivy = Path(ivy_dir) if ivy_dir else DEFAULT_IVY_DIR
    jars = sorted((ivy / "jars").glob("*.jar"))
    marker = f"io.delta_delta-spark_{spark_minor}_2.13-{delta_version}.jar"
    if any(jar.name == marker for jar in jars):
        location = {"spark.jars": ",".join(str(jar) for jar in jars)}
    else:
        location = {"spark.jars.packages": package, "spark.jars.ivy": str(ivy)}
    return {
        **location,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # The default (50) makes every snapshot of a tiny table cost 50 tasks.
        "spark.databricks.delta.snapshotPartitions": "2",
    }


@dataclass(frozen=True)
class DeltaBatch:
    """Per table, the batch summed per key as ``(keys..., inc)`` and materialised, so
    the serial commit phase runs only the MERGEs."""

    txid: int
    counters: dict[str, DataFrame] = field(default_factory=dict)
    dead_letters: DataFrame | None = None


def _brief(exc: BaseException) -> str:
    """The first line of a (py4j) error: the Java stack stays on the chained cause."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return lines[0][:400]


def _keys_match(keys: tuple[str, ...]) -> str:
    # Null-safe: a null key must match its own row, or every txid would insert a new one.
    return " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in keys)


class DeltaCommitter(CounterCommitter):
    """One Delta table per ``CounterTable`` at ``<path>/<name>``: key columns, ``count``
    (LONG), plus ``prev`` and ``txid`` in opaque mode; dead letters at
    ``<path>/dead_letters`` as ``(raw, reason, txid)``. Missing tables are created at
    open with STRING keys (create them beforehand for other key types: batches are cast
    to the table's types). Needs a classic (py4j) SparkSession, not Spark Connect.

    Opaque mode keeps ``(count, prev, txid)`` per row. Re-committing txid t undoes every
    row whose txid is t, also rows absent from the new attempt (whenNotMatchedBySource),
    so a replay that dropped a key is exact: a row t created is deleted, a row t changed
    gets ``count = prev`` back and ``txid = 0`` ("from before t").
    """

    def __init__(
        self,
        path: str,
        counters: Mapping[str, CounterTable],
        dead_letters: str | None = None,
        mode: CommitMode = CommitMode.TRANSACTIONAL,
    ) -> None:
        super().__init__(counters, dead_letters, mode)
        if dead_letters is not None and any(
            t.name == DEAD_LETTERS_TABLE for t in self.counters.values()
        ):
            raise ConfigurationError(
                f"counter table name {DEAD_LETTERS_TABLE!r} is taken by the dead-letter table"
            )
        # A relative path is not a valid Delta table name: anchor it here.
        self.path = path.rstrip("/") if "://" in path else os.path.abspath(path)
        self._key_types: dict[str, dict[str, str]] = {}
        self._sessions: dict[str, Any] = {}  # table -> its own session (see _SCOPED_CONF)

    # -- set-up ---------------------------------------------------------------------

    def location(self, table: str) -> str:
        return f"{self.path}/{table}"

    def _spark(self) -> Any:
        spark = self._context().spark
        if spark is None:
            raise ConfigurationError("DeltaCommitter needs the runner's SparkSession")
        return spark

    def _app_id(self, table: str) -> str:
        context = self._context()
        suffix = ":opaque" if self.mode is CommitMode.OPAQUE else ""
        return f"{context.topology_id}:{context.name}:{table}{suffix}"

    def open(self, context: CommitterContext) -> None:
        """Create missing tables and check existing ones, so that a wrong path or a table
        of the other mode fails at start rather than at the first commit."""
        self.context = context
        spark = self._spark()
        opaque = self.mode is CommitMode.OPAQUE
        for table in self.counters.values():
            columns = [(k, "STRING", True) for k in table.keys]
            columns.append(("count", "LONG", False))
            if opaque:
                columns += [("prev", "LONG", True), ("txid", "LONG", False)]
            schema = self._ensure_table(spark, table.name, columns)
            if not opaque and "txid" in schema:
                raise ConfigurationError(
                    f"Delta table {self.location(table.name)} has opaque-mode columns but "
                    f"committer {context.name!r} is in transactional mode; use a new path"
                )
            self._key_types[table.name] = {k: schema[k] for k in table.keys}
        if self.dead_letters is not None:
            columns = [("raw", "STRING", True), ("reason", "STRING", True), ("txid", "LONG", False)]
            self._ensure_table(spark, DEAD_LETTERS_TABLE, columns)
        for table in self.counters.values():
            session = spark.newSession()
            for key, value in _SCOPED_CONF.items():
                session.conf.set(key, value)
            self._sessions[table.name] = session

    def close(self) -> None:
        self._sessions.clear()

    def _tables(self) -> list[str]:
        tables = [t.name for t in self.counters.values()]
        if self.dead_letters is not None:
            tables.append(DEAD_LETTERS_TABLE)
        return tables

    def _ensure_table(
        self, spark: Any, table: str, columns: list[tuple[str, str, bool]]
    ) -> dict[str, str]:
        from delta.tables import DeltaTable

        location = self.location(table)
        try:
            builder = DeltaTable.createIfNotExists(spark).location(location)
            for name, sql_type, nullable in columns:
                builder = builder.addColumn(name, sql_type, nullable=nullable)
            builder.execute()
            fields = DeltaTable.forPath(spark, location).toDF().schema.fields
        except Exception as exc:
            raise ConfigurationError(
                f"cannot create or read the Delta table at {location}: {_brief(exc)}. Check "
                "that the path is writable and, if a table exists there, that it is a Delta table."
            ) from exc
        schema = {f.name: f.dataType.simpleString() for f in fields}
        missing = [name for name, _, _ in columns if name not in schema]
        if missing:
            raise ConfigurationError(
                f"Delta table {location} lacks column(s) {missing} (it has {sorted(schema)}): "
                "it was created for another configuration or mode; use a new path"
            )
        return schema

    # -- the two phases -------------------------------------------------------------

    def prepare(self, attempt: TransactionAttempt, inputs: Mapping[str, DataFrame]) -> DeltaBatch:
        """Sum per key and materialise in the parallel phase: the MERGE then joins a
        small, fixed source, and a replayed commit sees exactly the same rows."""
        from pyspark.sql import functions as F

        self.check_inputs(inputs)
        batch = DeltaBatch(attempt.txid)
        for input_name, table in self.counters.items():
            types = self._key_types.get(table.name)
            if types is None:
                raise ConfigurationError("DeltaCommitter.prepare before open()")
            summed = (
                inputs[input_name]
                .select(
                    *[F.col(k).cast(types[k]).alias(k) for k in table.keys],
                    F.col(table.value).alias("inc"),
                )
                .groupBy(*table.keys)
                .agg(F.coalesce(F.sum("inc"), F.lit(0)).cast("long").alias("inc"))
            )
            batch.counters[table.name] = summed.localCheckpoint(eager=True)
        if self.dead_letters is not None:
            dead = inputs[self.dead_letters].select(
                F.col("raw").cast("string"),
                F.col("reason").cast("string"),
                F.lit(attempt.txid).cast("long").alias("txid"),
            )
            batch = DeltaBatch(batch.txid, batch.counters, dead.localCheckpoint(eager=True))
        return batch

    def commit(self, attempt: TransactionAttempt, prepared: DeltaBatch) -> CommitOutcome:
        """One MERGE per counter table, one write for dead letters, each carrying the
        txid marker. A crash between tables is fine: the replay finds the marker on the
        tables already done and skips (transactional) or redoes (opaque) them.

        The tables are written one after the other: written in parallel threads (each
        on its own session) they took as long in total on a 2-core machine, each MERGE
        being CPU-bound planning and small tasks (see benchmarks/analysis.md)."""
        if prepared.txid != attempt.txid:
            raise CommitError(
                f"prepared batch is for txid {prepared.txid}, commit was asked for "
                f"{attempt.txid}: a stale prepare result reached commit"
            )
        leads = self._context().check_leadership
        outcomes: list[CommitOutcome] = []
        try:
            for table in self.counters.values():
                leads()  # right before each table's write: see the module's note on fencing
                outcomes.append(
                    self._commit_table(attempt.txid, table, prepared.counters[table.name])
                )
            if self.dead_letters is not None and prepared.dead_letters is not None:
                leads()
                outcomes.append(self._commit_dead_letters(attempt.txid, prepared.dead_letters))
        except TransactionalError:
            raise
        except Exception as exc:
            raise CommitError(
                f"Delta commit of txid {attempt.txid} under {self.path} failed: "
                f"{type(exc).__name__}: {_brief(exc)}. Retrying the commit is safe."
            ) from exc
        for outcome in (CommitOutcome.REAPPLIED, CommitOutcome.APPLIED):
            if outcome in outcomes:
                return outcome
        return CommitOutcome.SKIPPED

    def _next_version(self, table: str, txid: int) -> tuple[int | None, CommitOutcome]:
        """The marker version to write for ``txid`` (None: already holds it, skip)."""
        recorded = self.recorded_version(table)
        if self.mode is CommitMode.TRANSACTIONAL:
            if recorded is not None and recorded >= txid:
                return None, CommitOutcome.SKIPPED
            return txid, CommitOutcome.APPLIED
        held = None if recorded is None else recorded // ATTEMPT_SLOTS
        if held is None or held < txid:
            return txid * ATTEMPT_SLOTS, CommitOutcome.APPLIED
        if held > txid:
            raise CommitError(
                f"opaque commit of txid {txid} refused: Delta table {self.location(table)} "
                f"already holds txid {held}. The sink is ahead of the state store; was the "
                "store reset or another topology given this path?"
            )
        assert recorded is not None
        if (recorded + 1) // ATTEMPT_SLOTS != txid:
            raise CommitError(f"txid {txid} was rewritten {ATTEMPT_SLOTS} times; giving up")
        return recorded + 1, CommitOutcome.REAPPLIED

    def _commit_table(self, txid: int, table: CounterTable, source: DataFrame) -> CommitOutcome:
        from delta.tables import DeltaTable

        version, outcome = self._next_version(table.name, txid)
        if version is None:
            return outcome
        spark = self._sessions[table.name]
        keys = {k: f"s.`{k}`" for k in table.keys}
        merge = (
            DeltaTable.forPath(spark, self.location(table.name))
            .alias("t")
            .merge(source.alias("s"), _keys_match(table.keys))
        )
        if self.mode is CommitMode.TRANSACTIONAL:
            merge = merge.whenMatchedUpdate(set={"count": "t.`count` + s.inc"})
            merge = merge.whenNotMatchedInsert(values={**keys, "count": "s.inc"})
        else:
            t = str(txid)
            merge = (
                # Rows this txid wrote before: rebuild from prev (null: t created it).
                merge.whenMatchedUpdate(
                    condition=f"t.txid = {t}",
                    set={"count": "coalesce(t.prev, 0) + s.inc"},
                )
                .whenMatchedUpdate(
                    condition=f"t.txid < {t}",
                    set={"prev": "t.`count`", "count": "t.`count` + s.inc", "txid": t},
                )
                .whenNotMatchedInsert(
                    values={**keys, "count": "s.inc", "prev": "CAST(NULL AS BIGINT)", "txid": t}
                )
                # Rows the earlier attempt of t wrote that this attempt no longer has.
                .whenNotMatchedBySourceDelete(condition=f"t.txid = {t} AND t.prev IS NULL")
                .whenNotMatchedBySourceUpdate(
                    condition=f"t.txid = {t}",
                    set={"count": "t.prev", "prev": "CAST(NULL AS BIGINT)", "txid": "0"},
                )
            )
        # Only this table's thread uses its session, and only for this MERGE.
        spark.conf.set(TXN_APP_ID_CONF, self._app_id(table.name))
        spark.conf.set(TXN_VERSION_CONF, str(version))
        began = time.perf_counter()
        merge.execute()
        log.debug(
            "merged table=%s txid=%d seconds=%.2f", table.name, txid, time.perf_counter() - began
        )
        return outcome

    def _commit_dead_letters(self, txid: int, rows: DataFrame) -> CommitOutcome:
        version, outcome = self._next_version(DEAD_LETTERS_TABLE, txid)
        if version is None:
            return outcome
        writer = (
            rows.write.format("delta")
            .option("txnAppId", self._app_id(DEAD_LETTERS_TABLE))
            .option("txnVersion", version)
        )
        if self.mode is CommitMode.OPAQUE:
            # Replace this txid's rows in the same commit, so a replay whose bad records
            # differ leaves exactly its own.
            writer = writer.mode("overwrite").option("replaceWhere", f"txid = {txid}")
        else:
            writer = writer.mode("append")
        writer.save(self.location(DEAD_LETTERS_TABLE))
        return outcome

    # -- reading the markers ---------------------------------------------------------

    def recorded_version(self, table: str) -> int | None:
        """The marker version this committer last wrote to ``table``, from a fresh
        snapshot (``forTableWithSnapshot`` updates the cached log first).

        The markers are read from the version's checksum (.crc) when Delta wrote them
        there: milliseconds, where ``transactions()`` (and ``setTransactionsIfKnown``)
        cost a Spark job of about a second on a fresh snapshot.
        """
        spark = self._spark()
        app_id = self._app_id(table)
        delta_log = spark._jvm.org.apache.spark.sql.delta.DeltaLog
        snapshot = delta_log.forTableWithSnapshot(spark._jsparkSession, self.location(table))._2()
        checksum = snapshot.checksumOpt()
        if checksum.isDefined() and checksum.get().setTransactions().isDefined():
            markers = checksum.get().setTransactions().get()
            for i in range(markers.size()):
                marker = markers.apply(i)
                if marker.appId() == app_id:
                    return int(marker.version())
            return None
        found = snapshot.transactions().get(app_id)
        return int(found.get()) if found.isDefined() else None

    def committed_txid(self) -> int | None:
        """The lowest txid over all tables (None if a table holds none): tables commit
        independently, so only a txid every table holds is fully committed."""
        held: list[int] = []
        for table in self._tables():
            try:
                version = self.recorded_version(table)
            except Exception as exc:
                raise CommitError(
                    f"cannot read the txid marker of {self.location(table)}: {_brief(exc)}"
                ) from exc
            if version is None:
                return None
            held.append(
                version if self.mode is CommitMode.TRANSACTIONAL else version // ATTEMPT_SLOTS
            )
        return min(held)
