"""Plans built once (``Bolt.plan_once``): the engine re-points an attempt's plans at a
later batch (``SparkEngine.replan``), and the runner then calls a bolt once per run
while every batch is still counted from its own rows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from committers import CounterTable, RedisCommitter
from coordinators import SQLiteStateStore
from tests.integration.test_ledger import (
    Balanced,
    RowsCommitter,
    assert_balanced,
    harness,
    recounts,
)
from tests.integration.topologies import TOTAL, PlannedOnceBolt, RangeSpout, expected_counts
from transactional import (
    BatchConfigurationError,
    Bolt,
    LedgerError,
    RunnerConfig,
    TopologyBuilder,
    TransactionalRunner,
)
from transactional.engine import SparkEngine
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


def run(spark: Any, redis_url: str, tmp_path: Path, spout: RangeSpout) -> tuple[Any, int]:
    bolt = PlannedOnceBolt()
    committer = RedisCommitter(redis_url, {"default": CounterTable("buckets", ("key",))})
    topology = (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("bucket", bolt)
        .set_committer("sink", committer, "bucket")
        .build()
    )
    store = SQLiteStateStore(tmp_path / "state.db")
    config = RunnerConfig(topology_id="once", max_pending=1)  # one attempt builds the plans
    stats = TransactionalRunner(topology, store, spark, config).run(until_drained=True)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert {k: int(v) for k, v in client.hgetall("buckets").items()} == expected_counts()
    return stats, bolt.calls


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
    BalancedOnce.calls = 0
    sink = PlannedRows()
    run = ledger_run(spark, tmp_path, BalancedOnce(), sink)

    assert run.stats.failures == 0 and sink.last_txid == LEDGER_TOTAL // LEDGER_BATCH
    assert BalancedOnce.calls == 1
    assert_balanced(sink, LEDGER_TOTAL)
    assert recounted == []  # every txid balanced from its own observations


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
