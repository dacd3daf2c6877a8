"""Plans built once (``Bolt.plan_once``): the engine re-points an attempt's plans at a
later batch (``SparkEngine.replan``), and the runner then calls a bolt once per run
while every batch is still counted from its own rows."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from committers import CounterTable, RedisCommitter
from coordinators import SQLiteStateStore
from tests.integration.test_kept_blocks import FailOnce
from tests.integration.test_ledger import (
    Balanced,
    RowsCommitter,
    assert_balanced,
    harness,
    recounts,
)
from tests.integration.test_runner_spark import spark_jobs
from tests.integration.topologies import TOTAL, PlannedOnceBolt, RangeSpout, expected_counts
from transactional import (
    BatchConfigurationError,
    Bolt,
    LedgerError,
    RunnerConfig,
    TopologyBuilder,
    TransactionalRunner,
)
from transactional.errors import InjectedFault, NondeterministicSpoutError
from transactional.faults import FaultPoint
from transactional.runtime.ledger_books import Tap
from transactional.spark._replan import Fused
from transactional.spark.engine import ROWS_PER_TASK, SparkEngine
from transactional.testing import Range
from transactional.types import TransactionAttempt

pytestmark = pytest.mark.integration


def kept(engine: SparkEngine, values: list[int]) -> DataFrame:
    """A batch as ``materialise`` returns it: kept, and coalesced."""
    frame = engine.spark.createDataFrame([(v,) for v in values], "n long")
    return engine.materialise([frame], digest=False).batch


def counted(frame: DataFrame) -> dict[int, int]:
    return {r["k"]: r["c"] for r in frame.collect()}


def by_python(values: list[int]) -> dict[int, int]:
    return dict(Counter(v % 3 for v in values))


def test_a_plan_re_pointed_at_a_later_batch_reads_that_batch_only(spark: Any) -> None:
    engine = SparkEngine(spark)
    first, later = [1, 2, 3, 4], [10, 11, 13, 16, 19, 22]
    was, now = kept(engine, first), kept(engine, later)
    plan = (
        was.where(F.col("n") > 0).groupBy((F.col("n") % 3).alias("k")).agg(F.count("*").alias("c"))
    )
    replan = engine.replan([plan, was], was)
    assert replan is not None
    repointed = replan.over(now)
    assert repointed is not None

    assert counted(repointed.frame(plan)) == by_python(later)
    assert sorted(r["n"] for r in repointed.frame(was).collect()) == later
    assert counted(plan) == by_python(first)  # the template itself is unchanged


def test_batches_of_another_schema_are_not_re_pointed(spark: Any) -> None:
    engine = SparkEngine(spark)
    was = kept(engine, [1, 2])
    other = engine.materialise([spark.createDataFrame([(1,)], "n int")], digest=False).batch
    replan = engine.replan([was.select("n")], was)
    assert replan is not None and replan.over(other) is None


def test_a_join_of_the_batch_with_itself_is_re_pointed_on_both_sides(spark: Any) -> None:
    engine = SparkEngine(spark)
    was, now = kept(engine, [1, 2, 2]), kept(engine, [5, 5, 6])
    joined = was.join(was.groupBy("n").count(), "n")  # the analyser renames one side
    replan = engine.replan([joined], was)
    assert replan is not None
    repointed = replan.over(now)
    assert repointed is not None
    rows = sorted((r["n"], r["count"]) for r in repointed.frame(joined).collect())
    assert rows == [(5, 2), (5, 2), (6, 1)]


def test_a_plan_that_reads_the_batch_in_a_subquery_is_built_anew(spark: Any) -> None:
    engine = SparkEngine(spark)
    was = kept(engine, [1, 2, 3])
    above = was.where(F.col("n") > was.select(F.avg("n")).scalar())
    assert above.collect()[0]["n"] == 3  # a plan Spark runs
    assert engine.replan([above], was) is None
    assert engine.replan([was.where(F.col("n") > 2)], was) is not None


class LateIntSpout(RangeSpout):
    """``RangeSpout`` whose batches from ``switch`` on hold ``id`` as an int, not a
    long: a batch of another schema."""

    def __init__(self, switch: int) -> None:
        super().__init__()
        self.switch = switch

    def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> DataFrame:
        frame = super().emit_batch(attempt, meta)
        return frame.select(F.col("id").cast("int")) if attempt.txid >= self.switch else frame


def run(
    spark: Any,
    redis_url: str,
    tmp_path: Path,
    spout: RangeSpout,
    faults: Any = None,
    expected: dict[str, int] | None = None,
    bolt: PlannedOnceBolt | None = None,
    topology_id: str = "once",
) -> tuple[Any, int]:
    bolt = bolt or PlannedOnceBolt()
    stats = runner_of(spark, redis_url, tmp_path, spout, bolt, faults, topology_id).run(
        until_drained=True
    )
    assert buckets(redis_url) == (expected_counts() if expected is None else expected)
    return stats, bolt.calls


def runner_of(
    spark: Any,
    redis_url: str,
    tmp_path: Path,
    spout: RangeSpout,
    bolt: Bolt,
    faults: Any = None,
    topology_id: str = "once",
) -> TransactionalRunner:
    """``spout`` into ``bolt`` into Redis's ``buckets``, one txid in flight (so one
    attempt builds the plans)."""
    committer = RedisCommitter(redis_url, {"default": CounterTable("buckets", ("key",))})
    topology = (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("bucket", bolt)
        .set_committer("sink", committer, "bucket")
        .build()
    )
    store = SQLiteStateStore(tmp_path / "state.db")
    config = RunnerConfig(topology_id=topology_id, max_pending=1)
    return TransactionalRunner(topology, store, spark, config, faults=faults)


def buckets(redis_url: str) -> dict[str, int]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    return {k: int(v) for k, v in client.hgetall("buckets").items()}


def test_a_bolt_that_plans_once_is_called_once_and_every_batch_counted(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    stats, calls = run(spark, redis_url, tmp_path, RangeSpout())
    assert stats.committed_txids == TOTAL // 100 and calls == 1


def test_a_batch_of_another_schema_has_its_plans_built_anew_and_kept(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    stats, calls = run(spark, redis_url, tmp_path, LateIntSpout(switch=3))
    assert stats.committed_txids == TOTAL // 100 and calls == 2


#: The protocol's steps in the order an attempt meets them, but the one between two
#: committers: these topologies have one.
STEPS = [point for point in FaultPoint if point is not FaultPoint.BETWEEN_COMMITTERS]


class FailsAtEachStep:
    """An exception on the first attempt of txids 2 to 7, each at another step of
    ``STEPS``; each raise recorded here."""

    def __init__(self) -> None:
        self.fired: list[tuple[FaultPoint, int]] = []

    def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        planned = STEPS[attempt.txid - 2] if 2 <= attempt.txid < 2 + len(STEPS) else None
        if number == 1 and point is planned:
            self.fired.append((point, attempt.txid))
            raise InjectedFault(f"injected at {point.value} of txid {attempt.txid}")


def test_attempts_failed_at_every_step_are_retried_over_re_pointed_plans_exactly(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    """After a failure at any step, the txid's next attempt reads its batch anew and
    re-points the plans kept by txid 1: the bolt is still asked once, and the sink holds
    every number once (a failure after the sink's write is a replay it skips)."""
    total = 100 * (len(STEPS) + 2)  # txid 1 keeps the plans; 2..7 fail; 8 runs clean
    faults = FailsAtEachStep()
    expected = dict(Counter(f"k{n % 7}" for n in range(total)))
    stats, calls = run(spark, redis_url, tmp_path, OnePartition(total), faults, expected)
    assert faults.fired == [(point, txid) for txid, point in enumerate(STEPS, start=2)]
    # A failure after the store's advance fails the txid's cleanup, not the txid.
    assert stats.committed_txids == total // 100 and stats.failures == len(STEPS) - 1
    assert calls == 1


# The record ledger over plans built once: the books of a later attempt are the first
# one's, re-pointed, with observations of their own.


class PlannedRows(RowsCommitter):
    """``RowsCommitter``, whose collect plan is its inputs: the same for every txid."""

    plan_once = True


class BalancedOnce(Balanced):
    """``Balanced`` (carried, folded and dropped records), planned once; counts calls."""

    plan_once = True
    calls = 0

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> dict[str, DataFrame]:
        BalancedOnce.calls += 1
        return super().process(attempt, batch)


class LosesOnce(Bolt):
    """Carries every number on but ``lost``, and says nothing of it; planned once."""

    accounts = True
    plan_once = True
    calls = 0

    def __init__(self, lost: int) -> None:
        self.lost = lost

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        LosesOnce.calls += 1
        return batch.where(F.col("id") != self.lost)


LEDGER_TOTAL, LEDGER_BATCH = 100, 20


def ledger_run(spark: Any, tmp_path: Path, bolt: Bolt, sink: RowsCommitter) -> Any:
    return harness(
        spark, tmp_path, bolt, sink, spout=lambda: RangeSpout(LEDGER_TOTAL, LEDGER_BATCH)
    ).run_until_drained(max_pending=1, warm_up=False)


def test_an_accounting_bolt_planned_once_balances_every_txid_from_its_own_rows(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recounted = recounts(monkeypatch)
    counted: list[Any] = []
    exact = Tap.exact
    monkeypatch.setattr(Tap, "exact", lambda tap: counted.append(tap) or exact(tap))
    BalancedOnce.calls = 0
    sink = PlannedRows()
    run = ledger_run(spark, tmp_path, BalancedOnce(), sink)

    assert run.stats.failures == 0 and sink.last_txid == LEDGER_TOTAL // LEDGER_BATCH
    assert BalancedOnce.calls == 1
    assert_balanced(sink, LEDGER_TOTAL)
    # Every txid balanced from its own observations, each completed by the job that
    # collected its stream (the two streams by one job: a union, whose analysis
    # rewrites one side's observation), none counted by a job of its own.
    assert recounted == [] and counted == []


def test_a_record_lost_by_a_bolt_planned_once_fails_the_txid_that_held_it(
    spark: Any, tmp_path: Path
) -> None:
    lost = 2 * LEDGER_BATCH + 17  # in txid 3, an attempt whose plans were re-pointed
    LosesOnce.calls = 0
    sink = PlannedRows()
    with pytest.raises(BatchConfigurationError) as caught:
        ledger_run(spark, tmp_path, LosesOnce(lost), sink)
    cause = caught.value.cause
    assert isinstance(cause, LedgerError), cause
    assert caught.value.txid == 3 and cause.txid == 3
    assert (cause.given, cause.unaccounted, cause.named) == (LEDGER_BATCH, 1, (f"id={lost}",))
    assert LosesOnce.calls == 1
    assert sink.last_txid == 2
    assert sorted(r["id"] for r in sink.rows["default"]) == list(range(2 * LEDGER_BATCH))


def test_a_plan_over_a_checkpoint_of_its_own_is_built_anew(spark: Any) -> None:
    """A bolt that keeps what it made of the batch (``localCheckpoint``) holds rows of
    that batch: re-pointed, it would give them again for every later one."""
    engine = SparkEngine(spark)
    was = kept(engine, [1, 2, 3])
    own = was.where(F.col("n") > 1).localCheckpoint()
    assert engine.replan([own.select("n")], was) is None


def test_fused_frames_split_back_to_what_their_own_jobs_collect(spark: Any) -> None:
    engine = SparkEngine(spark)
    batch = kept(engine, [1, 2, 2, 7])
    frames = {
        (0, "sums"): batch.groupBy("n").agg(F.count("*").alias("c")),  # c: not nullable
        (0, "names"): batch.select(F.concat(F.lit("n"), F.col("n").cast("string")).alias("s")),
        (1, "none"): batch.where(F.col("n") > 100).select("n"),
    }
    own = engine.collect(frames)
    fused = Fused(frames)
    table = engine.collect({None: fused.frame})[None]
    split = fused.split(table, {key: got.schema for key, got in own.items()})

    assert set(split) == set(own)
    for key, got in own.items():
        assert split[key].schema == got.schema
        assert sorted(split[key].to_pylist(), key=str) == sorted(got.to_pylist(), key=str)
    assert sorted(r["c"] for r in split[(0, "sums")].to_pylist()) == [1, 1, 2]


class CountsAndBad(Bolt):
    """Numbers counted by remainder mod 7, multiples of 13 sent to dead letters; plans
    once."""

    outputs = ("default", "bad")
    plan_once = True

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> dict[str, DataFrame]:
        bad = F.col("id") % 13 == 0
        key = F.concat(F.lit("k"), (F.col("id") % 7).cast("string")).alias("key")
        return {
            "default": batch.where(~bad)
            .select(key)
            .groupBy("key")
            .agg(F.count("*").alias("count")),
            "bad": batch.where(bad).select(
                F.col("id").cast("string").alias("raw"), F.lit("thirteen").alias("reason")
            ),
        }


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_small_batchs_collects_are_one_spark_job_and_exact(
    spark: Any, redis_url: str, tmp_path: Path, partitions: int
) -> None:
    """A batch of one partition is read, counted and collected by one job; one of
    two is read by a job of its own (its partitions side by side), then collected by
    one job."""
    committer = RedisCommitter(
        redis_url, {"default": CounterTable("counts", ("key",))}, dead_letters="bad"
    )
    topology = (
        TopologyBuilder()
        .set_spout(OnePartition() if partitions == 1 else RangeSpout())
        .set_bolt("count", CountsAndBad())
        .set_committer("sink", committer, {"default": "count:default", "bad": "count:bad"})
        .build()
    )
    config = RunnerConfig(topology_id=f"fused{partitions}", max_pending=1)
    store = SQLiteStateStore(tmp_path / "state.db")
    stats = TransactionalRunner(topology, store, spark, config).run(until_drained=True)

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    expected = Counter(f"k{n % 7}" for n in range(TOTAL) if n % 13)
    assert {k: int(v) for k, v in client.hgetall("counts").items()} == expected
    letters = [json.loads(x) for x in client.lrange("dead_letters", 0, -1)]
    assert sorted(int(x["raw"]) for x in letters) == [n for n in range(TOTAL) if n % 13 == 0]
    # Spark's own record of each txid's jobs (its status store, settled): the first
    # materialises and collects its two frames by a job each; the later ones, their
    # plans re-pointed, read, count and collect the batch by one (two partitions: one
    # job reads and counts, one collects).
    jobs = jobs_by_txid(spark, f"fused{partitions}")
    assert stats.committed_txids == TOTAL // 100
    assert jobs == {1: 3, **{txid: partitions for txid in range(2, TOTAL // 100 + 1)}}


# The batch counted by the committers' one job (``materialise``'s ``defer``): a later
# attempt whose plans are re-pointed runs one Spark job, which reads the batch, counts
# and digests it, and collects what the committers need.


class OnePartition(RangeSpout):
    """``RangeSpout`` whose batches are one partition: read by one task either way."""

    def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> DataFrame:
        return super().emit_batch(attempt, meta).coalesce(1)


class SizedSpout(OnePartition):
    """``RangeSpout`` whose txids hold ``sizes`` numbers each, in order."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__(total=sum(sizes))
        self.sizes = sizes

    def initialize_transaction(self, txid: int, prev_meta: Range | None) -> Range:
        start = prev_meta.end if prev_meta else 0
        return Range(start=start, count=self.sizes[txid - 1])


class EmptyAt(OnePartition):
    """``RangeSpout`` whose txid ``empty`` emits no rows the first time (its numbers
    not there yet): the runner retracts it and decides it again."""

    def __init__(self, empty: int) -> None:
        super().__init__()
        self.empty = empty
        self.emptied = 0

    def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> DataFrame:
        frame = super().emit_batch(attempt, meta)
        if attempt.txid != self.empty or self.emptied:
            return frame
        self.emptied += 1
        return frame.where(F.lit(False))


def jobs_by_txid(spark: Any, topology_id: str) -> Counter[int]:
    """Each txid's Spark jobs, from Spark's own record (its status store, settled)."""
    jobs: Counter[int] = Counter()
    for _, description in spark_jobs(spark):
        if description is not None and description.startswith(f"{topology_id} "):
            jobs[int(description.split(" ")[1].removeprefix("txid="))] += 1
    return jobs


def test_a_batch_larger_than_a_task_counted_in_one_task_is_exact_and_the_next_read_apart(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    """Txid 3 is taken to be small, as txid 2 was: read as one task by the committers'
    job, which counts it. Txid 4, after a large one, is read and counted by a job of its
    own, in tasks of ``ROWS_PER_TASK``: another shape, so its plans are built anew, and
    again for txid 5, small once more."""
    sizes = [100, 100, ROWS_PER_TASK + 5, 100, 100, 100]
    expected = dict(Counter(f"k{n % 7}" for n in range(sum(sizes))))
    stats, calls = run(spark, redis_url, tmp_path, SizedSpout(sizes), None, expected)
    assert stats.committed_txids == len(sizes) and stats.failures == 0
    assert calls == 3  # txids 1, 4 and 5


def test_an_empty_batch_counted_by_the_committers_job_is_retracted_then_read_again(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    """Txid 3's first batch is empty: known once the committers' job has read it, then
    retracted, not committed, and the run, drained, ends; the next run commits it."""
    spout = EmptyAt(3)
    before = dict(Counter(f"k{n % 7}" for n in range(200)))
    stats, calls = run(spark, redis_url, tmp_path, spout, None, before)
    assert spout.emptied == 1 and stats.empty_polls == 1
    assert stats.committed_txids == 2 and calls == 1
    stats, calls = run(spark, redis_url, tmp_path, spout)
    assert stats.committed_txids == TOTAL // 100 - 2 and calls == 1


class ShuffledBolt(PlannedOnceBolt):
    """``PlannedOnceBolt`` over the batch spread to three partitions: its job has a
    shuffle, whose map stage reads the batch."""

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        return super().process(attempt, batch.repartition(3))


def test_a_plan_with_a_shuffle_has_its_batch_counted_by_a_job_of_its_own(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    """An observation in a map stage would be added twice by a task run again, so a
    batch read under a shuffle is counted by the materialising job, as before."""
    stats, calls = run(
        spark, redis_url, tmp_path, OnePartition(), bolt=ShuffledBolt(), topology_id="shuffled"
    )
    assert stats.committed_txids == TOTAL // 100 and calls == 1
    jobs = jobs_by_txid(spark, "shuffled")
    assert all(jobs[txid] >= 2 for txid in range(2, TOTAL // 100 + 1)), jobs


class KeepsNothing(PlannedOnceBolt):
    """``PlannedOnceBolt`` over none of the batch (a filter Spark knows keeps nothing,
    so its optimiser drops the batch's observation from the committers' job)."""

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        return super().process(attempt, batch.where(F.lit(False)))


def test_a_batch_the_committers_job_leaves_uncounted_is_counted_by_a_job_of_its_own(
    spark: Any, redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="transactional.runner")
    spout = OnePartition()
    stats, calls = run(spark, redis_url, tmp_path, spout, None, {}, KeepsNothing(), "none")
    assert stats.committed_txids == TOTAL // 100 and calls == 1
    assert stats.records == TOTAL  # each batch counted, by a job of its own
    apart = [r for r in caplog.records if "batch_counted_apart" in r.getMessage()]
    assert len(apart) == TOTAL // 100 - 1  # every txid whose plans were re-pointed
    jobs = jobs_by_txid(spark, "none")
    assert all(jobs[txid] == 2 for txid in range(2, TOTAL // 100 + 1)), jobs


class ChangesOnReplay(OnePartition):
    """``RangeSpout`` whose replay of txid 3 gives other numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.emitted = 0

    def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> DataFrame:
        frame = super().emit_batch(attempt, meta)
        if attempt.txid != 3:
            return frame
        self.emitted += 1
        return frame if self.emitted == 1 else frame.select((F.col("id") + 1).alias("id"))


def test_a_replay_that_differs_is_caught_when_the_committers_job_digests_it(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    bolt, spout = PlannedOnceBolt(), ChangesOnReplay()
    faults = FailOnce(FaultPoint.BEFORE_SINK_WRITE, 3)
    runner = runner_of(spark, redis_url, tmp_path, spout, bolt, faults, "changes")
    with pytest.raises(BatchConfigurationError) as caught:
        runner.run(until_drained=True)
    assert caught.value.txid == 3
    assert isinstance(caught.value.cause, NondeterministicSpoutError), caught.value.cause
    assert faults.failed == 1 and spout.emitted == 2 and bolt.calls == 1
    assert buckets(redis_url) == dict(Counter(f"k{n % 7}" for n in range(200)))  # txids 1, 2
