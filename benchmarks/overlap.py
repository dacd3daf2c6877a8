"""Commits on a latency-bound path: a Redis server ``--delay-ms`` away (a proxy on loopback
delays every request, ``tests.latency``), small txids whose processing is quick, so that
each commit's round trip is what bounds a run. The same txids, in one run, paired:

- ``exactly_once``: commits one at a time, in txid order, each after the store moved
  past the one before;
- ``at_least_once, one at a time``: the same order, without the last-txid check (a
  committer that does not let its commits overlap);
- ``at_least_once, overlapping``: up to ``max_pending`` commits at once
  (``Committer.overlapping_commits``), the store still moving past them in order;
- ``exactly_once, groups of 4``: what commit groups do for the same latency.

    python -m benchmarks.overlap [--delay-ms 300] [--txids 40] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from committers import CounterTable, RedisCommitter
from transactional import Bolt, TopologyBuilder, TransactionalSpout
from transactional.ledger import ID, folded
from transactional.testing import Range, TopologyHarness
from transactional.testing.proxy import TcpProxy
from transactional.topology import Topology
from transactional.types import Guarantee, TransactionAttempt

RECORDS = 1000  # per txid
MAX_PENDING = 4


class Numbers(TransactionalSpout[Range]):
    """``txids`` slices of ``spark.range``, ``RECORDS`` numbers each."""

    metadata_type = Range

    def __init__(self, txids: int) -> None:
        self.total = txids * RECORDS

    def open(self, context: Any) -> None:
        self.spark: SparkSession = context.spark

    def is_ready(self, txid: int, prev_meta: Range | None) -> bool:
        return (prev_meta.end if prev_meta else 0) < self.total

    def initialize_transaction(self, txid: int, prev_meta: Range | None) -> Range:
        return Range(start=prev_meta.end if prev_meta else 0, count=RECORDS)

    def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> DataFrame:
        return self.spark.range(meta.start, meta.end, numPartitions=1)


class Buckets(Bolt):
    accounts = True

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        keys = batch.select((F.col("id") % 100).cast("string").alias("key"), ID)
        return keys.groupBy("key").agg(F.count("*").alias("count"), *folded())


class OneAtATime(RedisCommitter):
    """The Redis committer with its commits kept one at a time."""

    def overlapping_commits(self) -> bool:
        return False


@dataclass
class Case:
    name: str
    guarantee: Guarantee
    committer: type[RedisCommitter] = RedisCommitter
    max_group: int = 1
    seconds: list[float] = field(default_factory=list)
    most_in_flight: int = 0


CASES = [
    Case("exactly_once", Guarantee.EXACTLY_ONCE),
    Case("at_least_once, one at a time", Guarantee.AT_LEAST_ONCE, OneAtATime),
    Case("at_least_once, overlapping", Guarantee.AT_LEAST_ONCE),
    Case("exactly_once, groups of 4", Guarantee.EXACTLY_ONCE, max_group=4),
]


def run_once(spark: SparkSession, url: str, case: Case, txids: int, work: Path) -> float:
    """One run of ``txids`` txids into a namespace and hash of their own; seconds."""
    name = uuid.uuid4().hex[:8]

    def build() -> Topology:
        sink = case.committer(url, {"default": CounterTable(f"b{name}", ("key",))}, namespace=name)
        return (
            TopologyBuilder()
            .set_spout(Numbers(txids))
            .set_bolt("buckets", Buckets())
            .set_committer("sink", sink, "buckets")
            .build()
        )

    harness = TopologyHarness(
        build, spark, topology_id=name, state_dir=work / name, guarantee=case.guarantee
    )
    began = time.perf_counter()
    run = harness.run_until_drained(max_pending=MAX_PENDING, max_group=case.max_group)
    seconds = time.perf_counter() - began
    assert run.stats.committed_txids == txids, run.stats
    return seconds


def measure(
    spark: SparkSession,
    redis_port: int,
    delay_ms: float,
    txids: int,
    repeat: int,
    progress: Callable[[str], None],
) -> list[str]:
    """The cases, paired (each repetition runs every case once, in turn); markdown lines."""
    work = Path(tempfile.mkdtemp(prefix="bench-overlap-"))
    try:
        for k in range(repeat + 1):  # the first round warms up, untimed
            for case in CASES if k % 2 else reversed(CASES):
                with TcpProxy(redis_port, delay_s=delay_ms / 1000) as proxy:
                    url = f"redis://127.0.0.1:{proxy.port}/0"
                    seconds = run_once(spark, url, case, txids, work)
                if k:
                    case.seconds.append(seconds)
                    case.most_in_flight = max(case.most_in_flight, proxy.most_in_flight)
                progress(f"overlap {case.name}: {seconds:.1f}s{'' if k else ' (warm-up)'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(CASES[0].seconds)
    lines = [
        f"| case ({txids} txids of {RECORDS:,} records, Redis {delay_ms:g} ms away) "
        "| txids/s (median) | vs exactly_once | commits at once (seen) | runs (s) |",
        "|---|---:|---:|---:|---|",
    ]
    for case in CASES:
        median = statistics.median(case.seconds)
        runs = ", ".join(f"{s:.1f}" for s in case.seconds)
        lines.append(
            f"| {case.name} | {txids / median:.1f} | {base / median:.2f}x "
            f"| {case.most_in_flight} | {runs} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overlap", description=__doc__)
    parser.add_argument("--delay-ms", type=float, default=300.0)
    parser.add_argument("--txids", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    from transactional.spark.session import create_spark_session
    from transactional.testing.servers import RedisServer

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    server = RedisServer()
    server.start()
    spark = create_spark_session("local[*]", "bench-overlap")
    try:
        lines = measure(spark, server.port, args.delay_ms, args.txids, args.repeat, progress)
        print("\n".join(lines))
    finally:
        spark.stop()
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
