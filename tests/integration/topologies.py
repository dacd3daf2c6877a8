"""Small topologies on real Spark for the runner's integration tests and the CLI test."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from committers import CounterTable, RedisCommitter
from transactional import Bolt, TopologyBuilder, TransactionalSpout
from transactional.testing import Range
from transactional.topology import Topology
from transactional.types import TransactionAttempt

TOTAL = 500
BATCH = 100


def expected_counts() -> dict[str, int]:
    """Numbers 0..TOTAL-1 bucketed by ``n % 7``: computed without Spark."""
    counts: dict[str, int] = {}
    for n in range(TOTAL):
        counts[f"k{n % 7}"] = counts.get(f"k{n % 7}", 0) + 1
    return counts


def _sleep_600(column: str) -> Any:
    """A filter that keeps every row after sleeping ten minutes on each."""
    return F.udf(lambda n: __import__("time").sleep(600) is None, "boolean")(column)


class RangeSpout(TransactionalSpout[Range]):
    """``spark.range`` slices: the same metadata always gives the same rows."""

    metadata_type = Range

    def __init__(
        self,
        total: int = TOTAL,
        batch: int = BATCH,
        slow_txid: int | None = None,
        slow_sample: bool = False,
    ):
        self.total, self.batch, self.slow_txid = total, batch, slow_txid
        self.slowed = 0
        #: Give a sample whose reading sleeps far past any timeout (None: no sample).
        self.slow_sample = slow_sample

    def open(self, context: Any) -> None:
        self.spark: SparkSession = context.spark

    def is_ready(self, txid: int, prev_meta: Range | None) -> bool:
        return (prev_meta.end if prev_meta else 0) < self.total

    def initialize_transaction(self, txid: int, prev_meta: Range | None) -> Range:
        start = prev_meta.end if prev_meta else 0
        return Range(start=start, count=min(self.batch, self.total - start))

    def sample_batch(self) -> DataFrame | None:
        if not self.slow_sample:
            return None
        return self.spark.range(0, 10, numPartitions=2).where(_sleep_600("id"))

    def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> DataFrame:
        df = self.spark.range(meta.start, meta.end, numPartitions=2)
        if attempt.txid == self.slow_txid and self.slowed == 0:
            self.slowed += 1
            # The first attempt of this txid runs far past its timeout.
            df = df.where(_sleep_600("id"))
        return df


class BucketBolt(Bolt):
    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        return (
            batch.select(F.concat(F.lit("k"), (F.col("id") % 7).cast("string")).alias("key"))
            .groupBy("key")
            .agg(F.count("*").alias("count"))
        )


def build(spark: SparkSession, redis_url: str, spout: RangeSpout | None = None) -> Topology:
    committer = RedisCommitter(redis_url, {"default": CounterTable("buckets", ("key",))})
    return (
        TopologyBuilder()
        .set_spout(spout or RangeSpout())
        .set_bolt("bucket", BucketBolt())
        .set_committer("sink", committer, "bucket")
        .build()
    )


def build_from_env(spark: SparkSession) -> Topology:
    """The factory form ``transactional run`` takes (``module:function(spark)``)."""
    import os

    return build(spark, os.environ["BUCKETS_REDIS_URL"])


class PlannedOnceBolt(BucketBolt):
    """``BucketBolt`` whose plan the runner may build once (``plan_once``); it counts
    its calls, so a test sees how many times it was asked to build."""

    plan_once = True

    def __init__(self) -> None:
        self.calls = 0

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        self.calls += 1
        return super().process(attempt, batch)
