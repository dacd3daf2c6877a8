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

Each table is its own atomic commit, so a reader of several tables may see them at
different txids while a commit runs; ``DeltaCommitter.snapshot`` (``committers.snapshot``)
gives every table as of one committed txid.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from committers.counters import CounterCommitter, CounterTable
from committers.delta_sql import (
    OVERFLOW_MARK,
    batch_overflow_error,
    batch_sums,
    checked_add,
    checked_sums,
    diagnosed,
    keys_match,
    merge_overflow_error,
    merge_overflows,
)
from committers.delta_tables import brief, delta_spark_conf, ensure_table, open_counter_table
from committers.keys import exact_key_cast, supported, why_unsupported
from committers.snapshot import (
    ATTEMPT_SLOTS,
    latest_marker,
    next_marker,
    read_snapshot,
    table_root,
)
from transactional.committer import CommitterContext
from transactional.errors import CommitError, ConfigurationError, TransactionalError
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("committers.delta")

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
MATERIALIZE_SOURCE_CONF = "spark.databricks.delta.merge.materializeSource"
DEAD_LETTERS_TABLE = "dead_letters"

#: Spark sessions are cheap views of one SparkContext, each with its own SQL conf.
#: The txn confs are session-wide and MERGE has no per-call option for them, so every
#: table gets a session of its own: no other code's write on the runner's session (and
#: no other committer's) can pick up our marker, and no lock is needed.
_SCOPED_CONF = {
    # The source is a checkpointed, summed batch: Delta's own copy of it is waste.
    MATERIALIZE_SOURCE_CONF: "none",
    # decimal(38,s) + decimal(38,s) keeps its s decimals (the default drops one); the
    # sums are try_add/try_cast anyway, so an overflow is a null, never a rounding.
    "spark.sql.decimalOperations.allowPrecisionLoss": "false",
    "spark.sql.storeAssignmentPolicy": "ANSI",
}


@dataclass(frozen=True)
class DeltaBatch:
    """Per table, the batch summed per key as ``(keys..., inc)`` and materialised, so
    the serial commit phase runs only the MERGEs."""

    txid: int
    counters: dict[str, DataFrame] = field(default_factory=dict)
    dead_letters: DataFrame | None = None


class DeltaCommitter(CounterCommitter):
    """One Delta table per ``CounterTable`` at ``<path>/<name>``: key columns, ``count``
    (the declared ``value_type``: BIGINT, DOUBLE or DECIMAL(p,s)), plus ``prev`` (the
    same type) and ``txid`` in opaque mode; dead letters at ``<path>/dead_letters`` as
    ``(raw, reason, txid)``. Missing tables are created at open with the declared
    ``key_types`` (STRING for undeclared keys); an existing table keeps its own, and a
    batch key is cast to the table's type only when that keeps distinct keys distinct.
    Key types: string, integers, boolean, date, timestamp(_ntz), decimal, binary.
    Needs a classic (py4j) SparkSession, not Spark Connect.

    Opaque mode keeps ``(count, prev, txid)`` per row. Re-committing txid t undoes every
    row whose txid is t, also rows absent from the new attempt (whenNotMatchedBySource),
    so a replay that dropped a key is exact: a row t created is deleted, a row t changed
    gets ``count = prev`` back and ``txid = 0`` ("from before t").

    A sum that cannot be stored (beyond LONG, beyond the decimal's digits, a NaN or an
    infinite double) fails the batch (``prepare``) or that table's MERGE (nothing of it
    written) with a ``ContractError`` naming the key: see ``committers.delta_sql``.
    """

    sink = "delta"

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
        self.path = table_root(path)
        self._key_types: dict[str, dict[str, str]] = {}
        self._sessions: dict[str, Any] = {}  # table -> its own session (see _SCOPED_CONF)

    # -- set-up ---------------------------------------------------------------------

    def spark_conf(self) -> dict[str, str]:
        """Delta's jars and SQL extensions (``delta_spark_conf``)."""
        return delta_spark_conf()

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
            location = self.location(table.name)
            key_types = open_counter_table(self.who(), spark, location, table, opaque)
            self._key_types[table.name] = key_types
        if self.dead_letters is not None:
            columns = [("raw", "STRING", True), ("reason", "STRING", True), ("txid", "LONG", False)]
            ensure_table(spark, self.location(DEAD_LETTERS_TABLE), columns)
        for table in self.counters.values():
            session = spark.newSession()
            for key, value in _SCOPED_CONF.items():
                session.conf.set(key, value)
            self._sessions[table.name] = session

    def key_problem(self, table: CounterTable, column: str, sql: str) -> str | None:
        """A batch key is cast to the table's key type only when distinct keys stay
        distinct (``"01"`` and ``"1"`` cast to INT would merge)."""
        if not supported(sql, "delta"):
            return f"Delta cannot match it exactly ({why_unsupported(sql)})"
        target = self._key_types.get(table.name, {}).get(column)
        if target is None or exact_key_cast(sql, target):
            return None
        return (
            f"Delta table {self.location(table.name)} keys it as {target}, and a cast "
            f"from {sql} could merge distinct keys or fail: cast it to {target} in the "
            "bolt, or use a new table created with key_types"
        )

    def close(self) -> None:
        self._sessions.clear()

    def _tables(self) -> list[str]:
        tables = [t.name for t in self.counters.values()]
        if self.dead_letters is not None:
            tables.append(DEAD_LETTERS_TABLE)
        return tables

    # -- the two phases -------------------------------------------------------------

    def prepare(self, attempt: TransactionAttempt, inputs: Mapping[str, DataFrame]) -> DeltaBatch:
        """Sum per key in the declared type and materialise in the parallel phase: the
        MERGE then joins a small, fixed source, and a replayed commit sees exactly the
        same rows. A sum the type cannot hold is a ``ContractError`` here, before any
        commit."""
        from pyspark.sql import functions as F

        if not self._key_types:
            raise ConfigurationError("DeltaCommitter.prepare before open()")
        self.check_inputs(inputs)
        batch = DeltaBatch(attempt.txid)
        for input_name, table in self.counters.items():
            sums, bad = batch_sums(inputs[input_name], table, self._key_types[table.name])
            try:
                checked = checked_sums(sums, bad, table).localCheckpoint(eager=True)
            except Exception as exc:
                if OVERFLOW_MARK not in str(exc):
                    raise
                rows = diagnosed(sums.where(bad).limit(5).collect)
                who = self.who()
                raise batch_overflow_error(who, attempt.txid, input_name, table, rows) from exc
            batch.counters[table.name] = checked
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
        done: list[str] = []
        try:
            for table in self.counters.values():
                leads()  # right before each table's write: see the module's note on fencing
                outcomes.append(
                    self._commit_table(attempt.txid, table, prepared.counters[table.name], done)
                )
                done.append(table.name)
            if self.dead_letters is not None and prepared.dead_letters is not None:
                leads()
                outcomes.append(self._commit_dead_letters(attempt.txid, prepared.dead_letters))
        except TransactionalError:
            raise
        except Exception as exc:
            raise CommitError(
                f"Delta commit of txid {attempt.txid} under {self.path} failed: "
                f"{type(exc).__name__}: {brief(exc)}. Retrying the commit is safe."
            ) from exc
        for outcome in (CommitOutcome.REAPPLIED, CommitOutcome.APPLIED):
            if outcome in outcomes:
                return outcome
        return CommitOutcome.SKIPPED

    def _next_version(self, table: str, txid: int) -> tuple[int | None, CommitOutcome]:
        """The marker version to write for ``txid`` (None: already holds it, skip)."""
        recorded = self.recorded_version(table)
        return next_marker(recorded, txid, self.mode, f"Delta table {self.location(table)}")

    def _commit_table(
        self, txid: int, table: CounterTable, source: DataFrame, done: list[str]
    ) -> CommitOutcome:
        from delta.tables import DeltaTable

        version, outcome = self._next_version(table.name, txid)
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
        if self.mode is CommitMode.TRANSACTIONAL:
            merge = merge.whenMatchedUpdate(set={"count": checked_add("t.`count`", table)})
            merge = merge.whenNotMatchedInsert(values={**keys, "count": "s.inc"})
        else:
            t = str(txid)
            zero = f"CAST(0 AS {table.declared.sql})"
            merge = (
                # Rows this txid wrote before: rebuild from prev (null: t created it).
                merge.whenMatchedUpdate(
                    condition=f"t.txid = {t}",
                    set={"count": checked_add(f"coalesce(t.prev, {zero})", table)},
                )
                .whenMatchedUpdate(
                    condition=f"t.txid < {t}",
                    set={"prev": "t.`count`", "count": checked_add("t.`count`", table), "txid": t},
                )
                .whenNotMatchedInsert(values={**keys, "count": "s.inc", "prev": null, "txid": t})
                # Rows the earlier attempt of t wrote that this attempt no longer has.
                .whenNotMatchedBySourceDelete(condition=f"t.txid = {t} AND t.prev IS NULL")
                .whenNotMatchedBySourceUpdate(
                    condition=f"t.txid = {t}",
                    set={"count": "t.prev", "prev": null, "txid": "0"},
                )
            )
        # This session is this table's alone (see _SCOPED_CONF), used by the commit
        # thread for this MERGE only: the marker cannot reach another write.
        spark.conf.set(TXN_APP_ID_CONF, self._app_id(table.name))
        spark.conf.set(TXN_VERSION_CONF, str(version))
        began = time.perf_counter()
        try:
            merge.execute()
        except Exception as exc:
            if OVERFLOW_MARK not in str(exc):
                raise
            opaque = txid if self.mode is CommitMode.OPAQUE else None
            location = self.location(table.name)
            spark = self._spark()
            rows = diagnosed(lambda: merge_overflows(spark, location, source, table, opaque))
            raise merge_overflow_error(self.who(), txid, location, table, rows, done) from exc
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
        version of the table (``committers.snapshot.latest_marker``)."""
        return latest_marker(self.location(table), self._app_id(table))

    #: ``DeltaCommitter.snapshot(spark, path, topology_id, committer_name, tables,
    #: txid=None, mode=None)``: every table in ``tables`` (counter table names,
    #: ``"dead_letters"``) under ``path`` as of one committed txid of the committer
    #: ``committer_name`` of ``topology_id`` (``committers.snapshot.read_snapshot``).
    snapshot = staticmethod(read_snapshot)

    def committed_txid(self) -> int | None:
        """The lowest txid over all tables (None if a table holds none): tables commit
        independently, so only a txid every table holds is fully committed."""
        held: list[int] = []
        for table in self._tables():
            try:
                version = self.recorded_version(table)
            except Exception as exc:
                raise CommitError(
                    f"cannot read the txid marker of {self.location(table)}: {brief(exc)}"
                ) from exc
            if version is None:
                return None
            held.append(
                version if self.mode is CommitMode.TRANSACTIONAL else version // ATTEMPT_SLOTS
            )
        return min(held)
