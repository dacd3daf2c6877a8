"""A user's own topology, as a data engineer would write it for ``transactional run``:
CSV files of ``account,amount`` lines (one file per partition, read by line ranges),
a bolt that sums amounts per account, and the ready-made committers storing the sums
with the amount's own type: DOUBLE in Redis and Delta, DECIMAL(38,3) in Delta.

Settings come from the environment (the factory takes none): ``AMOUNTS_INPUT`` (the
directory of ``*.csv`` files), ``AMOUNTS_REDIS_URL``, ``AMOUNTS_DELTA`` (a directory)
and ``AMOUNTS_BATCH`` (lines per partition per txid).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from committers import CounterTable, DeltaCommitter, RedisCommitter
from transactional import Bolt, PartitionedTransactionalSpout, TopologyBuilder
from transactional.testing import Range
from transactional.topology import Topology
from transactional.types import TransactionAttempt


class CsvLines(PartitionedTransactionalSpout[Range]):
    """Each ``*.csv`` file of a directory is a partition; a batch is a line range."""

    metadata_type = Range

    def __init__(self, directory: Path, batch: int) -> None:
        self.files = sorted(directory.glob("*.csv"))
        self.batch = batch

    def open(self, context: Any) -> None:
        self.spark = context.spark

    def lines(self, partition: int) -> list[str]:
        return self.files[partition].read_text().splitlines()

    def num_partitions(self) -> int:
        return len(self.files)

    def is_ready(self, txid: int, last_metas: Mapping[int, Range]) -> bool:
        return any(
            (last_metas[p].end if p in last_metas else 0) < len(self.lines(p))
            for p in range(len(self.files))
        )

    def emit_partition_batch_new(self, attempt: Any, partition: int, last: Range | None) -> Range:
        start = last.end if last else 0
        return Range(start=start, count=max(0, min(self.batch, len(self.lines(partition)) - start)))

    def emit_partition_batch(self, attempt: Any, partition: int, meta: Range) -> DataFrame:
        rows = [line.split(",") for line in self.lines(partition)[meta.start : meta.end]]
        return self.spark.createDataFrame(
            [(account, Decimal(amount)) for account, amount in rows],
            "account string, amount decimal(18,3)",
        )


class SumAmounts(Bolt):
    """Per account: the sum as a DOUBLE (``total``) and as an exact DECIMAL (``exact``)."""

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        return batch.groupBy("account").agg(
            F.sum(F.col("amount").cast("double")).alias("total"),
            F.sum("amount").alias("exact"),
        )


def build() -> Topology:
    redis = RedisCommitter(
        os.environ["AMOUNTS_REDIS_URL"],
        {"sums": CounterTable("balances", ("account",), value="total", value_type="double")},
    )
    delta = DeltaCommitter(
        os.environ["AMOUNTS_DELTA"],
        {
            "doubles": CounterTable("balances", ("account",), value="total", value_type="double"),
            "decimals": CounterTable(
                "exact_balances", ("account",), value="exact", value_type="decimal(38,3)"
            ),
        },
    )
    spout = CsvLines(Path(os.environ["AMOUNTS_INPUT"]), int(os.environ.get("AMOUNTS_BATCH", "4")))
    return (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("sum", SumAmounts())
        .set_committer("redis", redis, {"sums": "sum"})
        .set_committer("delta", delta, {"doubles": "sum", "decimals": "sum"})
        .build()
    )
