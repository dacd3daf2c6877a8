"""A topology whose one Delta committer writes two tables per txid (numbers bucketed
by ``n % 7``, and by parity), for ``transactional run``. With ``TWO_TABLES_KILL=T`` the
process kills itself with SIGKILL (its whole tree, as ``--crash-at`` does) right
after the first table's MERGE of txid T: inside the committer's multi-table commit,
one table holding T and the other not.

Settings from the environment: ``TWO_TABLES_DELTA`` (a directory), ``TWO_TABLES_TOTAL``
(numbers 0..TOTAL-1), ``TWO_TABLES_BATCH`` (numbers per txid), ``TWO_TABLES_DRIVER_ROWS``
(the committer's ``max_driver_rows``: 0 commits through delta-spark; default: delta-rs).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from committers import CounterTable, DeltaCommitter
from committers.delta._committer import MAX_DRIVER_ROWS
from tests.integration.topologies import BucketBolt, RangeSpout
from transactional import Bolt, TopologyBuilder
from transactional.faults import kill_process_tree
from transactional.topology import Topology
from transactional.types import TransactionAttempt


class ParityBolt(Bolt):
    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        parity = F.when(F.col("id") % 2 == 0, "even").otherwise("odd")
        return batch.select(parity.alias("key")).groupBy("key").agg(F.count("*").alias("count"))


class KilledBetweenTables(DeltaCommitter):
    """Dies after writing its first table of txid ``kill_txid``."""

    def __init__(self, *args: Any, kill_txid: int | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kill_txid = kill_txid

    def _commit_table(
        self, span: tuple[int, int], table: CounterTable, source: Any, done: list[str]
    ) -> Any:
        outcome = super()._commit_table(span, table, source, done)
        txid = span[1]
        if self.kill_txid is not None and span[0] <= self.kill_txid <= txid:
            print(f"killed_between_tables txid={txid} after={table.name}", flush=True)
            sys.stderr.flush()
            kill_process_tree()
        return outcome


def build() -> Topology:
    kill = os.environ.get("TWO_TABLES_KILL")
    committer = KilledBetweenTables(
        os.environ["TWO_TABLES_DELTA"],
        {"bucket": CounterTable("buckets", ("key",)), "parity": CounterTable("parity", ("key",))},
        kill_txid=int(kill) if kill else None,
        max_driver_rows=int(os.environ.get("TWO_TABLES_DRIVER_ROWS", MAX_DRIVER_ROWS)),
    )
    spout = RangeSpout(int(os.environ["TWO_TABLES_TOTAL"]), int(os.environ["TWO_TABLES_BATCH"]))
    return (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("bucket", BucketBolt())
        .set_bolt("parity", ParityBolt())
        .set_committer("sink", committer, {"bucket": "bucket", "parity": "parity"})
        .build()
    )
