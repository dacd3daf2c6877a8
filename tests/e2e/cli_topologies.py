"""Topologies for the ``transactional`` command's end-to-end tests, as a user writes them:
factories with no argument, settings from the environment (``CLI_REDIS_URL``,
``CLI_TOTAL`` numbers, ``CLI_FAIL_TXID``: a txid whose batch always fails,
``CLI_IDLE``: after the numbers, keep polling instead of draining)."""

from __future__ import annotations

import os
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from committers import CounterTable, RedisCommitter
from transactional import Bolt, TopologyBuilder, TransactionalSpout
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


def numbers() -> Topology:
    fail = os.environ.get("CLI_FAIL_TXID")
    committer = RedisCommitter(
        os.environ["CLI_REDIS_URL"], {"default": CounterTable("buckets", ("key",))}
    )
    return (
        TopologyBuilder()
        .set_spout(Numbers(int(os.environ.get("CLI_TOTAL", "500"))))
        .set_bolt("bucket", Buckets(int(fail) if fail else None))
        .set_committer("sink", committer, "bucket")
        .build()
    )


def not_a_topology() -> Any:
    return {"spout": "numbers"}
