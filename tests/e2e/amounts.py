"""A user's own topology, as a data engineer would write it for ``transactional run``:
``account,amount`` records read by a library source (CSV lines with a header or Parquet
files, one file per partition; or three Redis streams of entries with the fields
``account`` and ``amount``), a bolt that sums amounts per account
and sends records that do not fit to the dead letters, and the ready-made committers
storing the sums with the amount's own type: DOUBLE in Redis and Delta, DECIMAL(38,3)
in Delta; and aggregate states of the records: per account their number, the largest
(Redis) and smallest (Delta) amount, and the last txid's greatest amount (both).

Settings come from the environment (the factory takes none): ``AMOUNTS_INPUT`` (the
directory of files), ``AMOUNTS_FORMAT`` (``csv``, the default, ``parquet``, ``delta``: a
Delta table at ``AMOUNTS_INPUT``, local or in S3, or ``stream``: the streams
``amounts:0`` to ``amounts:2`` at ``AMOUNTS_REDIS_URL``),
``AMOUNTS_REDIS_URL``, ``AMOUNTS_DELTA`` (a directory), ``AMOUNTS_BATCH`` (records
per partition per txid), ``AMOUNTS_SINKS`` (``redis,delta``, the default, or one of
them) and ``AMOUNTS_CALLS`` (a file the bolt appends the txid of each call to; unset:
none).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from committers import Count, CounterTable, DeltaCommitter, Last, Max, Min, RedisCommitter
from transactional import Bolt, TopologyBuilder
from transactional.ledger import ID, drop, folded
from transactional.sources.delta import DeltaTableSpout
from transactional.sources.files import FilesPartitionedSpout
from transactional.sources.redis_streams import RedisStreamsPartitionedSpout
from transactional.topology import Topology
from transactional.types import TransactionAttempt

#: The records' schema: the CSV source parses each line into it.
SCHEMA = "account STRING, amount DECIMAL(18,3)"


class SumAmounts(Bolt):
    """Per account: the sum as a DOUBLE (``total``) and as an exact DECIMAL (``exact``);
    a record the source flagged (a CSV line that does not fit the schema) goes to the
    dead letters with its text and the reason.

    It accounts for its records (``transactional.ledger``): each record is folded into
    its account's sums or sent to the dead letters (one route), and carried into
    ``records`` or dropped from it as a dead letter (another)."""

    outputs = ("default", "records", "dead_letters")
    accounts = True
    routes = (("default", "dead_letters"), ("records",))
    #: The same plan every txid: built once a run, re-pointed at each later batch.
    plan_once = True

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> Mapping[str, DataFrame]:
        calls = os.environ.get("AMOUNTS_CALLS")
        if calls:  # the tests see when the runner asked for the plans
            with open(calls, "a") as out:
                out.write(f"{attempt.txid}\n")
        if "fields" in batch.columns:  # Redis Streams: the entry's fields as text
            text = F.col("fields")["amount"]
            amount = text.try_cast("decimal(18,3)")
            fits = amount.isNotNull() & (amount == text.try_cast("decimal(38,18)"))
            batch = batch.select(
                F.col("fields")["account"].alias("account"),
                amount.alias("amount"),
                F.to_json("fields").alias("raw"),
                F.coalesce("error", F.when(~fits, F.lit("amount is not a decimal(18,3)"))).alias(
                    "error"
                ),
                ID,
            )
        elif "error" not in batch.columns:  # Parquet: typed rows, nothing to flag
            batch = batch.select("*", F.lit(None).cast("string").alias("raw"))
            batch = batch.select("*", F.lit(None).cast("string").alias("error"))
        ok = F.col("error").isNull()
        drop(batch.where(~ok), "a dead letter", stream="records")
        return {
            "default": batch.where(ok)
            .groupBy("account")
            .agg(
                F.sum(F.col("amount").cast("double")).alias("total"),
                F.sum("amount").alias("exact"),
                *folded(),
            ),
            "records": batch.where(ok).select(
                "account", "amount", F.col("amount").alias("size"), ID
            ),
            "dead_letters": batch.where(~ok).select("raw", F.col("error").alias("reason"), ID),
        }


def build() -> Topology:
    amount = "decimal(18,3)"
    # The last txid's greatest amount: ordered by the amount's size, as the records
    # carry no position of their own.
    latest = Last("latest", "account", "amount", order_by="size", value_type=amount)
    redis = RedisCommitter(
        os.environ["AMOUNTS_REDIS_URL"],
        {
            "sums": CounterTable("balances", ("account",), value="total", value_type="double"),
            "records": Count("records", "account"),
            "largest": Max("largest", "account", "amount", amount),
            "latest": latest,
        },
        dead_letters="bad",
    )
    delta = DeltaCommitter(
        os.environ["AMOUNTS_DELTA"],
        {
            "doubles": CounterTable("balances", ("account",), value="total", value_type="double"),
            "decimals": CounterTable(
                "exact_balances", ("account",), value="exact", value_type="decimal(38,3)"
            ),
            "records": Count("records", "account"),
            "smallest": Min("smallest", "account", "amount", amount),
            "latest": latest,
        },
    )
    batch = int(os.environ.get("AMOUNTS_BATCH", "4"))
    spout: Any
    layout = os.environ.get("AMOUNTS_FORMAT", "csv")
    if layout == "delta":  # a Delta table's appended versions
        spout = DeltaTableSpout(os.environ["AMOUNTS_INPUT"], batch)
    elif layout == "stream":
        spout = RedisStreamsPartitionedSpout(
            os.environ["AMOUNTS_REDIS_URL"], [f"amounts:{p}" for p in range(3)], batch
        )
    elif layout == "parquet":
        spout = FilesPartitionedSpout(os.environ["AMOUNTS_INPUT"], batch, format="parquet")
    else:
        spout = FilesPartitionedSpout(
            os.environ["AMOUNTS_INPUT"], batch, format="csv", schema=SCHEMA, header=True
        )
    sinks = os.environ.get("AMOUNTS_SINKS", "redis,delta").split(",")
    builder = TopologyBuilder().set_spout(spout).set_bolt("sum", SumAmounts())
    if "redis" in sinks:
        builder = builder.set_committer(
            "redis",
            redis,
            {
                "sums": "sum",
                "records": "sum:records",
                "largest": "sum:records",
                "latest": "sum:records",
                "bad": "sum:dead_letters",
            },
        )
    if "delta" in sinks:
        builder = builder.set_committer(
            "delta",
            delta,
            {
                "doubles": "sum",
                "decimals": "sum",
                "records": "sum:records",
                "smallest": "sum:records",
                "latest": "sum:records",
            },
        )
    return builder.build()
