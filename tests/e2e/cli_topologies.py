"""Topologies for the ``transactional`` command's end-to-end tests, as a user writes them:
settings from the environment (``CLI_REDIS_URL``, ``CLI_DELTA``: a directory of Delta
tables, ``CLI_TOTAL`` numbers, ``CLI_FAIL_TXID``: a txid whose batch always fails).
Without ``--until-drained`` a run keeps polling once the numbers are committed.

The module imports only installed packages (``transactional``, ``committers``,
pyspark), so a test may copy it into a directory of its own and run it from there,
as a user's module. ``numbers_in_delta`` takes no argument (the CLI creates the
session with its committer's Spark settings); ``numbers_in_delta_given_spark`` takes
the session, the older form, which gets Delta's settings because delta-spark is
installed."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from committers import CounterTable, DeltaCommitter, RedisCommitter
from transactional import Bolt, TopologyBuilder, TransactionalSpout
from transactional.ledger import ID, folded
from transactional.testing import Range
from transactional.topology import Topology
from transactional.types import TransactionAttempt

DEFAULT_BATCH = 50


class Numbers(TransactionalSpout[Range]):
    """0..total-1; the size of a new txid is ``--batch-size`` if given, else 50."""

    metadata_type = Range

    def __init__(self, total: int) -> None:
        self.total = total

    def open(self, context: Any) -> None:
        self.context = context

    def is_ready(self, txid: int, prev: Range | None) -> bool:
        return (prev.end if prev else 0) < self.total

    def initialize_transaction(self, txid: int, prev: Range | None) -> Range:
        start = prev.end if prev else 0
        size = self.context.batch_size(DEFAULT_BATCH)
        return Range(start=start, count=min(size, self.total - start))

    def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> DataFrame:
        return self.context.spark.range(meta.start, meta.end, numPartitions=1)


class Buckets(Bolt):
    def __init__(self, fail_txid: int | None) -> None:
        self.fail_txid = fail_txid

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        if attempt.txid == self.fail_txid:
            raise RuntimeError(f"cannot bucket txid {attempt.txid}")
        return (
            batch.select(F.concat(F.lit("k"), (F.col("id") % 7).cast("string")).alias("key"))
            .groupBy("key")
            .agg(F.count("*").alias("count"))
        )


def _numbers_into(committer: Any) -> Topology:
    fail = os.environ.get("CLI_FAIL_TXID")
    return (
        TopologyBuilder()
        .set_spout(Numbers(int(os.environ.get("CLI_TOTAL", "500"))))
        .set_bolt("bucket", Buckets(int(fail) if fail else None))
        .set_committer("sink", committer, "bucket")
        .build()
    )


def numbers() -> Topology:
    """Bucket counts into the Redis hash ``buckets``."""
    return _numbers_into(
        RedisCommitter(os.environ["CLI_REDIS_URL"], {"default": CounterTable("buckets", ("key",))})
    )


def numbers_in_delta() -> Topology:
    """Bucket counts into the Delta table ``$CLI_DELTA/buckets``."""
    return _numbers_into(
        DeltaCommitter(os.environ["CLI_DELTA"], {"default": CounterTable("buckets", ("key",))})
    )


def numbers_in_delta_given_spark(spark: SparkSession) -> Topology:
    """The older factory form: the session exists before the topology does."""
    if not isinstance(spark, SparkSession):
        raise TypeError(f"expected the SparkSession, got {type(spark).__name__}")
    return numbers_in_delta()


def slow_to_build() -> Topology:
    """Touches ``$CLI_READY``, then takes a minute to build: a signal meanwhile must
    end the command at once (nothing has started)."""
    Path(os.environ["CLI_READY"]).touch()
    time.sleep(60)
    return numbers()


def not_a_topology() -> Any:
    return {"spout": "numbers"}


def numbers_from_kafka() -> Topology:
    """The values of the Kafka topic ``$CLI_KAFKA_TOPIC`` at ``$CLI_KAFKA``, by length,
    into the Redis hash ``lengths``."""
    from transactional.sources.kafka import KafkaPartitionedSpout

    sink = RedisCommitter(os.environ["CLI_REDIS_URL"], {"default": CounterTable("lengths", ("n",))})
    spout = KafkaPartitionedSpout(os.environ["CLI_KAFKA"], os.environ["CLI_KAFKA_TOPIC"])
    return (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("length", Lengths())
        .set_committer("sink", sink, "length")
        .build()
    )


class Lengths(Bolt):
    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        return batch.groupBy(F.length("raw").alias("n")).count()


class MissingColumn(Bolt):
    """Reads the column ``nope``, which the batch lacks; appends each call's txid to the
    file ``$CLI_CALLS``."""

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        with open(os.environ["CLI_CALLS"], "a") as calls:
            calls.write(f"{attempt.txid}\n")
        return batch.groupBy(F.col("nope").alias("key")).count()


def numbers_missing_column() -> Topology:
    """``numbers``, bucketed by a column the batch does not have."""
    return _numbers_through(MissingColumn())


def _numbers_through(bolt: Bolt) -> Topology:
    """The numbers through ``bolt`` into the Redis hash ``buckets``."""
    sink = RedisCommitter(
        os.environ["CLI_REDIS_URL"], {"default": CounterTable("buckets", ("key",))}
    )
    return (
        TopologyBuilder()
        .set_spout(Numbers(int(os.environ.get("CLI_TOTAL", "500"))))
        .set_bolt("bucket", bolt)
        .set_committer("sink", sink, "bucket")
        .build()
    )


class LosesOdd(Bolt):
    """Says it accounts for every record, yet counts only the even numbers."""

    accounts = True

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        even = batch.where(F.col("id") % 2 == 0)
        return (
            even.select(F.concat(F.lit("k"), (F.col("id") % 7).cast("string")).alias("key"), ID)
            .groupBy("key")
            .agg(F.count("*").alias("count"), *folded())
        )


def numbers_losing_odd() -> Topology:
    """``numbers``, through a bolt that loses the odd ones (the ledger stops it)."""
    return _numbers_through(LosesOdd())
