"""The framework's side of the latency benchmark (``benchmarks.latency``), as a user
writes a topology for ``transactional run``: a Kafka topic of events, each value the
event's epoch milliseconds as text, counted per 100 ms bucket into a Redis hash
(``<LATENCY_KEY_PREFIX>buckets``, field = the bucket, ``ms // 100``), exactly once.

Settings from the environment: ``LATENCY_KAFKA`` (bootstrap servers), ``LATENCY_TOPIC``,
``LATENCY_REDIS_URL`` and ``LATENCY_KEY_PREFIX``.

    transactional run benchmarks.latency_topology:build --topology-id latency ...
"""

from __future__ import annotations

import os

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from committers import CounterTable, RedisCommitter
from transactional import Bolt, TopologyBuilder
from transactional.ledger import ID, folded
from transactional.sources.kafka import KafkaPartitionedSpout
from transactional.topology import Topology
from transactional.types import TransactionAttempt

#: Milliseconds per bucket.
BUCKET_MS = 100
#: The hash of the counts (after the key prefix) and its key column.
TABLE = "buckets"


def bucket_of(text: Column) -> Column:
    """The bucket of an event's text: null where the text is not an integer (Spark's
    ANSI cast would fail the whole batch on it; ``try_cast`` gives null). Structured
    Streaming's side (``benchmarks.latency``) counts with it too."""
    return F.floor(text.try_cast("long") / BUCKET_MS).cast("long")


class CountBuckets(Bolt):
    outputs = ("default", "dead_letters")
    accounts = True  # each event counted, or a dead letter: checked by the ledger
    plan_once = True  # the same plan for every txid: built once, re-pointed at each batch

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> dict[str, DataFrame]:
        parsed = batch.withColumn("bucket", bucket_of(F.col("raw")))
        ok = F.col("error").isNull() & F.col("bucket").isNotNull()
        reason = F.coalesce(F.col("error"), F.lit("not epoch milliseconds"))
        return {
            "default": parsed.where(ok)
            .groupBy("bucket")
            .agg(F.count("*").alias("count"), *folded()),
            "dead_letters": parsed.where(~ok).select("raw", reason.alias("reason"), ID),
        }


class CountBucketsEachTxid(CountBuckets):
    """``CountBuckets`` with its plan built in every txid (the breakdown's comparison)."""

    plan_once = False


def build(batch_size: int = 10_000, plan_once: bool = True) -> Topology:
    """``batch_size``: offsets per partition per txid (``--batch-size`` wins over it).
    ``plan_once`` False: the bolt's plan built in every txid."""
    spout = KafkaPartitionedSpout(
        os.environ.get("LATENCY_KAFKA", "127.0.0.1:9092"),
        os.environ.get("LATENCY_TOPIC", "latency"),
        batch_size=batch_size,
        start="earliest",
    )
    sink = RedisCommitter(
        os.environ.get("LATENCY_REDIS_URL", "redis://127.0.0.1:6379/0"),
        {TABLE: CounterTable(TABLE, ("bucket",), key_types={"bucket": "long"})},
        dead_letters="bad",
        key_prefix=os.environ.get("LATENCY_KEY_PREFIX", "latency:"),
    )
    return (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("count", CountBuckets() if plan_once else CountBucketsEachTxid())
        .set_committer("sink", sink, inputs={TABLE: "count:default", "bad": "count:dead_letters"})
        .build()
    )
