"""Counters and dead letters in Delta Lake tables, one MERGE or write per table per commit.

Both modes record the txid in Delta's own idempotent-write marker (a ``SetTransaction``
action: app id -> version), which is written in the same atomic commit as the data and
read back from the table's snapshot. Transactional mode uses the txid as the version, so
Delta itself skips a replay. Opaque mode must be able to write the same txid again, so
its version is ``txid * ATTEMPT_SLOTS + n`` (n counts rewrites of that txid): it still
grows strictly, and ``version // ATTEMPT_SLOTS`` is the txid the table holds.

Fencing a deposed leader: a table cannot compare a fence token inside a MERGE the way
the Redis script does, so each leadership claims a table before its first write to it:
an empty commit carrying the runner's fence token as an app transaction of its own
(``<topology>:<committer>:<table>:fence``), refused (``FencedError``) if the table holds
a higher token; and each write first reads the table's token at the version it writes
on, refused likewise. A leader deposed *after* that read, its write under way, loses to
Delta's conflict check: the new leader's commits carry the same txid marker's app id,
and Delta refuses a commit whose app transaction another commit changed since its read
version. So a deposed leader never writes a txid its successor wrote, in either mode.
The committer also checks the runner still leads right before each table's write
(``CommitterContext.check_leadership``), which stops a deposed leader sooner.

Each table is its own atomic commit, so a reader of several tables may see them at
different txids while a commit runs; ``DeltaCommitter.snapshot`` (``committers.delta._snapshot``)
gives every table as of one committed txid.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from committers._sums import batch_sums
from committers.counters import BAD_COLUMN, CounterCommitter
from committers.delta._arrow import Unstorable, combined_sums
from committers.delta._location import is_object_store, table_root
from committers.delta._read import DeltaReader
from committers.delta._rs import DriverWriter
from committers.delta._snapshot import read_snapshot
from committers.delta._spark import ExecutorWriter, concat
from committers.delta._sql import batch_overflow_error
from committers.delta._tables import brief, delta_spark_conf, ensure_table, open_counter_table
from committers.delta._target import DEAD_LETTERS_TABLE, DeltaTarget, Writer
from committers.keys import exact_key_cast, supported, why_unsupported
from committers.tables import CounterTable
from transactional.committer import CommitterContext, Rollback
from transactional.errors import CommitError, ConfigurationError, TransactionalError
from transactional.lineage import Dataset, at_path
from transactional.preflight import check_writable_dir
from transactional.spark.checkpoints import checkpoint
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger("committers.delta")


#: Above this many rows a table's per-txid sums (or a txid's dead letters) are not
#: brought to the driver: that table is merged by delta-spark from the executors.
#: Measured (benchmarks/delta_paths.py, 2 cores): prepare plus commit of 1M sums took
#: 8.8 s on the delta-rs path (driver peak 795 MiB) against 11.2 s on delta-spark; of
#: 3M sums, 45 s (1.5 GiB) against 25 s.
MAX_DRIVER_ROWS = 1_000_000

#: Why a table in S3 is written by delta-rs only.
_S3_WRITER = (
    "only the driver's delta-rs writer commits safely (its commits are S3 conditional "
    "writes; delta-spark's S3 log store assumes it is the only writer)"
)

#: A table holding more files than this is compacted after a commit (delta-rs'
#: OPTIMIZE; delta-spark's auto compaction waits for 50 small files likewise). A soak of
#: small txids without it grew a file per txid in a table of new keys, and the cost of
#: each commit with them.
COMPACT_FILES = 50


@dataclass(frozen=True)
class DeltaBatch:
    """Per table, the batch summed per key as ``(keys..., inc)``: an Arrow table on the
    driver, or (above ``max_driver_rows``) a checkpointed Spark frame; so the serial
    commit phase runs only the writes."""

    txid: int
    counters: dict[str, pa.Table | DataFrame] = field(default_factory=dict)
    dead_letters: pa.Table | DataFrame | None = None


class DeltaCommitter(CounterCommitter):
    """One Delta table per ``CounterTable`` at ``<path>/<name>``: key columns, ``count``
    (the declared ``value_type``: BIGINT, DOUBLE or DECIMAL(p,s)), plus ``prev`` (the
    same type) and ``txid`` in opaque mode; dead letters at ``<path>/dead_letters`` as
    ``(raw, reason, txid)``. Missing tables are created at open with the declared
    ``key_types`` (STRING for undeclared keys); an existing table keeps its own, and a
    batch key is cast to the table's type only when that keeps distinct keys distinct.
    Key types: string, integers, boolean, date, timestamp(_ntz), decimal, binary.
    Needs a classic (py4j) SparkSession, not Spark Connect.

    Two commit paths, the same tables and markers: two writers the committer owns,
    picked per table and commit by size. A table's per-txid sums of at most
    ``max_driver_rows`` rows (the common case: sums are small next to their input) are
    collected as Arrow and merged on the driver by delta-rs (``DriverWriter``), in tens
    of milliseconds; larger ones are merged by delta-spark from the executors
    (``ExecutorWriter``), so the driver's memory stays bounded. Dead letters likewise.
    What it reads back is its ``DeltaReader``'s. A table the driver's writer wrote is
    compacted after the commit once it holds more than ``compact_files`` files (0:
    never).

    Opaque mode keeps ``(count, prev, txid)`` per row. Re-committing txid t undoes every
    row whose txid is t, also rows absent from the new attempt (whenNotMatchedBySource),
    so a replay that dropped a key is exact: a row t created is deleted, a row t changed
    gets ``count = prev`` back and ``txid = 0`` ("from before t").

    A sum that cannot be stored (beyond LONG, beyond the decimal's digits, a NaN or an
    infinite double) fails the batch (``prepare``) or that table's MERGE (nothing of it
    written) with a ``ContractError`` naming the key: see ``committers.delta._sql``.
    """

    sink = "delta"
    #: ``collect_plan`` depends only on its inputs' schemas (``Committer.plan_once``).
    plan_once = True

    def __init__(
        self,
        path: str,
        counters: Mapping[str, CounterTable],
        dead_letters: str | None = None,
        mode: CommitMode = CommitMode.TRANSACTIONAL,
        max_driver_rows: int = MAX_DRIVER_ROWS,
        compact_files: int = COMPACT_FILES,
    ) -> None:
        super().__init__(counters, dead_letters, mode)
        self.max_driver_rows = _count(
            "max_driver_rows", max_driver_rows, "always merge with delta-spark"
        )
        self.compact_files = _count("compact_files", compact_files, "never compact")
        if dead_letters is not None and any(
            t.name == DEAD_LETTERS_TABLE for t in self.counters.values()
        ):
            raise ConfigurationError(
                f"counter table name {DEAD_LETTERS_TABLE!r} is taken by the dead-letter table"
            )
        self.path = table_root(path)
        if max_driver_rows == 0:
            self._refuse_spark_writes(
                type(self).__name__,
                "max_driver_rows=0 merges every table with delta-spark",
                "leave max_driver_rows at its default",
            )
        self._key_types: dict[str, dict[str, str]] = {}
        target = DeltaTarget(
            self.mode, self.path, self._tables(), self._context, self.who, self.compact_files
        )
        self._target = target
        self._reader = DeltaReader(target)
        self._driver = DriverWriter(target)
        self._executors = ExecutorWriter(target)

    def _tables(self) -> tuple[str, ...]:
        """Every table's name: the counter tables', then the dead letters' if any."""
        names = [t.name for t in self.counters.values()]
        return (*names, DEAD_LETTERS_TABLE) if self.dead_letters is not None else tuple(names)

    def _refuse_spark_writes(self, who: str, what: str, change: str) -> None:
        """The object-store rule: in S3 only delta-rs writes (``_S3_WRITER``), so
        ``what``, which would have delta-spark write, is refused there, saying ``change``;
        anywhere else it is allowed."""
        if is_object_store(self.path):
            raise ConfigurationError(f"{who}: {what}; in S3 ({self.path}) {_S3_WRITER}: {change}")

    # -- set-up ---------------------------------------------------------------------

    def preflight(self) -> None:
        check_writable_dir(self.path, "the Delta tables' directory")

    def spark_conf(self) -> dict[str, str]:
        """Delta's jars and SQL extensions (``delta_spark_conf``); for tables in S3, the
        ``s3a`` connector too (``transactional.spark.storage.s3_spark_conf``)."""
        if is_object_store(self.path):
            from transactional.spark.session import merged
            from transactional.spark.storage import s3_spark_conf

            return merged(delta_spark_conf(), s3_spark_conf())
        return delta_spark_conf()

    def location(self, table: str) -> str:
        return self._target.location(table)

    def lineage_datasets(self) -> Sequence[Dataset]:
        """Each counter table, and the dead letters' when there are any."""
        return tuple(at_path(self.location(name)) for name in self._tables())

    def _spark(self) -> Any:
        spark = self._context().spark
        if spark is None:
            raise ConfigurationError("DeltaCommitter needs the runner's SparkSession")
        return spark

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
        self._driver.open()
        spark_only = [n for n in self._tables() if not self._driver.writes(n)]
        if spark_only:
            self._refuse_spark_writes(
                self.who(),
                f"Delta tables {spark_only} use table features delta-rs does not write "
                "(deletion vectors or column mapping)",
                "use new tables",
            )
        self._executors.open(spark, [t.name for t in self.counters.values()])

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
        self._executors.close()
        self._driver.close()

    # -- the two phases -------------------------------------------------------------

    def collect_plan(
        self, attempt: TransactionAttempt, inputs: Mapping[str, DataFrame]
    ) -> dict[str, DataFrame]:
        """Per table, the batch summed per key in the declared type, with a flag on a sum
        the type cannot hold; and the dead letters. Each is cut at one row more than
        ``max_driver_rows``, so the driver never receives more."""

        if not self._key_types:
            raise ConfigurationError("DeltaCommitter.prepare before open()")
        self.check_inputs(inputs)
        limit = self.max_driver_rows + 1
        plan = {}
        for input_name, table in self.counters.items():
            if not self._driver.writes(table.name):
                continue
            sums, bad = batch_sums(inputs[input_name], table, self._key_types[table.name])
            flagged = sums.select(*table.keys, "inc", bad.alias(BAD_COLUMN))
            plan[table.name] = flagged.limit(limit)
        if self.dead_letters is not None and self._driver.writes(DEAD_LETTERS_TABLE):
            plan[DEAD_LETTERS_TABLE] = self._dead_rows(inputs).limit(limit)
        return plan

    def _dead_rows(self, inputs: Mapping[str, DataFrame]) -> DataFrame:
        """The dead letters' rows, without their txid: the plan is the same for every
        txid (``plan_once``), and the txid is added where they are written."""
        from pyspark.sql import functions as F

        assert self.dead_letters is not None
        return inputs[self.dead_letters].select(
            F.col("raw").cast("string"), F.col("reason").cast("string")
        )

    def prepare_collected(
        self,
        attempt: TransactionAttempt,
        inputs: Mapping[str, DataFrame],
        collected: Mapping[str, pa.Table],
    ) -> DeltaBatch:
        """A sum the type cannot hold is a ``ContractError`` here, before any commit. A
        table whose sums exceed ``max_driver_rows`` is summed again in Spark and
        checkpointed, for delta-spark's MERGE."""
        batch = DeltaBatch(attempt.txid)
        for input_name, table in self.counters.items():
            sums = collected.get(table.name)
            if sums is None or sums.num_rows > self.max_driver_rows:
                self._check_executors_may_write(attempt.txid, table.name)
                frame, key_types = inputs[input_name], self._key_types[table.name]
                sums = self._executors.sums(attempt, input_name, table, frame, key_types)
                batch.counters[table.name] = sums
                continue
            bad = sums.filter(sums.column(BAD_COLUMN))
            if bad.num_rows:
                rows = bad.slice(0, 5).to_pylist()
                who = self.who()
                raise batch_overflow_error(who, attempt.txid, input_name, table, rows)
            batch.counters[table.name] = sums.drop_columns([BAD_COLUMN])
        if self.dead_letters is not None:
            import pyarrow
            from pyspark.sql import functions as F

            txid = attempt.txid
            letters: pa.Table | None = collected.get(DEAD_LETTERS_TABLE)
            dead: pa.Table | DataFrame
            if letters is None or letters.num_rows > self.max_driver_rows:
                self._check_executors_may_write(txid, DEAD_LETTERS_TABLE)
                with_txid = self._dead_rows(inputs).withColumn("txid", F.lit(txid).cast("long"))
                dead = checkpoint(with_txid, eager=True)
            else:
                txids = pyarrow.array([txid] * letters.num_rows, pyarrow.int64())
                dead = letters.append_column("txid", txids)
            batch = DeltaBatch(batch.txid, batch.counters, dead)
        return batch

    def _check_executors_may_write(self, txid: int, table: str) -> None:
        """Refuse a table too large for the driver when the tables are in S3."""
        self._refuse_spark_writes(
            self.who(),
            f"txid {txid} brings more than max_driver_rows ({self.max_driver_rows:,}) rows "
            f"for Delta table {table!r}",
            "raise max_driver_rows (the driver holds them as Arrow), or make the batches smaller",
        )

    def groupable(self, prepared: Any) -> bool:
        """A batch whose sums and dead letters are all on the driver (Arrow): a group of
        them is added there and merged as one. A table merged by delta-spark is not."""
        import pyarrow as pa

        parts = [*prepared.counters.values(), prepared.dead_letters]
        return all(p is None or isinstance(p, pa.Table) for p in parts)

    def commit(self, attempt: TransactionAttempt, prepared: DeltaBatch) -> CommitOutcome:
        """One MERGE per counter table, one write for dead letters, each carrying the
        txid marker. A crash between tables is fine: the replay finds the marker on the
        tables already done and skips (transactional) or redoes (opaque) them.

        The tables are written one after the other: written in parallel threads (each
        on its own session) they took as long in total on a 2-core machine, each MERGE
        being CPU-bound planning and small tasks (see benchmarks/analysis.md)."""
        self.check_prepared([attempt], [prepared])
        return self._commit_span((attempt.txid, attempt.txid), prepared)

    def commit_group(
        self, attempts: Sequence[TransactionAttempt], prepared: Sequence[DeltaBatch | None]
    ) -> CommitOutcome:
        """The group's sums added per key (``committers.delta._arrow.combined_sums``, exactly; on
        Spark if a txid's table was too large for the driver), then one MERGE per table
        marked with the last txid, as ``commit`` does for one."""
        self.check_prepared(attempts, prepared)
        span = (attempts[0].txid, attempts[-1].txid)
        given = [b for b in prepared if b is not None]
        combined = DeltaBatch(span[1])
        for input_name, table in self.counters.items():
            parts = [b.counters[table.name] for b in given]
            combined.counters[table.name] = self._group_sums(span, input_name, table, parts)
        if self.dead_letters is not None:
            dead = [b.dead_letters for b in given if b.dead_letters is not None]
            combined = DeltaBatch(span[1], combined.counters, concat(dead))
        return self._commit_span(span, combined)

    def _commit_span(self, span: tuple[int, int], prepared: DeltaBatch) -> CommitOutcome:
        leads = self._context().check_leadership
        outcomes: list[CommitOutcome] = []
        done: list[str] = []
        first, txid = span
        try:
            for table in self.counters.values():
                leads()  # right before each table's write: see the module's note on fencing
                self._claim(table.name)
                outcomes.append(
                    self._commit_table(span, table, prepared.counters[table.name], done)
                )
                done.append(table.name)
            if self.dead_letters is not None:
                leads()
                self._claim(DEAD_LETTERS_TABLE)
                outcomes.append(self._commit_dead_letters(span, prepared.dead_letters))
        except TransactionalError:
            raise
        except Exception as exc:
            what = f"txid {txid}" if first == txid else f"txids {first}..{txid}"
            raise CommitError(
                f"Delta commit of {what} under {self.path} failed: "
                f"{type(exc).__name__}: {brief(exc)}. Retrying the commit is safe."
            ) from exc
        for outcome in (CommitOutcome.REAPPLIED, CommitOutcome.APPLIED):
            if outcome in outcomes:
                return outcome
        return CommitOutcome.SKIPPED

    def _claim(self, table: str) -> None:
        """The table claimed with this leadership's fence token before its first write
        (``DriverWriter.claim``), by the writer that can write it."""
        writer = self._driver if self._driver.writes(table) else self._executors
        writer.claim(table)

    def _commit_table(
        self,
        span: tuple[int, int],
        table: CounterTable,
        source: pa.Table | DataFrame | None,
        done: list[str],
    ) -> CommitOutcome:
        return self._writer(source).merge(span, table, source, done)

    def _commit_dead_letters(
        self, span: tuple[int, int], rows: pa.Table | DataFrame | None
    ) -> CommitOutcome:
        return self._writer(rows).dead_letters(span, rows)

    def _writer(self, rows: pa.Table | DataFrame | None) -> Writer[Any]:
        """The writer of ``rows``: delta-spark's for a Spark frame (rows too many for
        the driver, or a table delta-rs does not write), else delta-rs'."""
        from pyspark.sql import DataFrame

        return self._executors if isinstance(rows, DataFrame) else self._driver

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
        return self._executors.group_sums(table, parts)

    # -- reading back (``DeltaReader``) ------------------------------------------------

    def lookup(self, table: CounterTable, keys: list[tuple[Any, ...]]) -> list[Any]:
        """The keys' rows of the table's latest version, read by delta-rs (no Spark)."""
        return self._reader.lookup(table, keys)

    def recorded_version(self, table: str) -> int | None:
        """The marker version this committer last wrote to ``table``, from a fresh
        version of the table (``committers.delta._snapshot.latest_marker``)."""
        return self._reader.recorded_version(table)

    def committed_txid(self) -> int | None:
        """The lowest txid over all tables (None if a table holds none): tables commit
        independently, so only a txid every table holds is fully committed."""
        return self._reader.committed_txid()

    def sink_marker(self, topology_id: str, name: str) -> int | None:
        return self._reader.sink_marker(topology_id, name)

    def rollback(self, topology_id: str, name: str, txid: int) -> Rollback:
        """Every table (dead letters included) restored to its version holding ``txid``
        (``committers.delta._rewind``); refused before anything is written when a table
        has no such version."""
        return self._reader.rollback(topology_id, name, txid)

    #: ``DeltaCommitter.snapshot(spark, path, topology_id, committer_name, tables,
    #: txid=None, mode=None)``: every table in ``tables`` (counter table names,
    #: ``"dead_letters"``) under ``path`` as of one committed txid of the committer
    #: ``committer_name`` of ``topology_id`` (``committers.delta._snapshot.read_snapshot``).
    snapshot = staticmethod(read_snapshot)


def _count(name: str, value: object, zero: str) -> int:
    """``value`` of the parameter ``name``, an integer >= 0 (``zero``: what 0 means)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(
            f"DeltaCommitter: {name} must be an integer >= 0 (0: {zero}), got {value!r}"
        )
    return value
