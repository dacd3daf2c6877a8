"""Where a txid's time goes, step by step (issue 54): the latency benchmark's topology
(``benchmarks.latency_topology``: Kafka, a counting bolt that accounts through the
ledger, the Redis committer, SQLite store) run in this process at ``max_pending=1``, so
that no txid shares the cores with another, over a topic written in full beforehand:
``TXIDS`` small txids (``SMALL`` records, one partition), as many with the bolt's plan
built in every txid (``EACH_TXID``), and ``TXIDS`` large ones (``LARGE`` records over
``PARTITIONS`` partitions), after ``WARM_UP`` small txids left out while the JVM
compiles. Each step's median over the txids, as the runner's own
timings (``RunStats.timings``) measured them; and the driver JVM's CPU per txid.

Then the floor of a ``SMALL``-record batch in the same warmed JVM (``measure_floor``),
each after ``FLOOR_WARM_UP`` rounds of its own: Structured Streaming's micro-batch
(``maxOffsetsPerTrigger``, the same count in ``foreachBatch``, its own
``triggerExecution``), the least any engine that runs a Spark job per batch pays (the
records read by Spark's Kafka reader and collected: one query planned, one job), and a
Spark job of nothing (``spark.range``).

    python -m benchmarks.breakdown [--txids 20] [--large 125000] [--warm-up 300]
        [--floor-warm-up 200] [--section]

``make bench`` runs it as a process of its own (its Spark session needs Kafka's reader)
and adds its section (``--section``) to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORK = Path(__file__).resolve().parent / ".work" / "breakdown"
TXIDS = 20
#: Small txids run first and left out, for the JVM to compile Spark's planning code:
#: a small txid took 262 ms after 90 txids and 187 ms after 460 (analysis.md).
WARM_UP = 300
SMALL = 10
LARGE = 125_000
PARTITIONS = 4
#: The small case with its bolt's plan built in every txid (``Bolt.plan_once`` off).
EACH_TXID = "small, plans built each txid"
#: Rounds of each floor case run first and left out (the JVM has run ``WARM_UP`` txids).
FLOOR_WARM_UP = 200

Progress = Callable[[str], None]

#: The columns of the table: (title, ``TxTiming`` field, scale to milliseconds).
STEPS = (
    ("decide", "decide_s"),
    ("store", "store_s"),
    ("read (emit)", "emit_s"),
    ("process", "process_s"),
    ("prepare", "prepare_s"),
    ("verify", "verify_s"),
    ("queued", "queued_s"),
    ("commit", "commit_s"),
    ("advance", "advance_s"),
)


@dataclass
class Breakdown:
    name: str
    records: int
    partitions: int
    timings: list[Any]
    #: Seconds between one commit and the next (from the second txid's on).
    gaps_s: list[float]
    #: The driver JVM's CPU seconds over the run, and its JIT compilers' (None: unknown).
    jvm_cpu_s: float | None = None
    jit_s: float | None = None

    def median_ms(self, field: str) -> float:
        return statistics.median(getattr(t, field) for t in self.timings) * 1000

    @property
    def per_txid_ms(self) -> float:
        return statistics.median(self.gaps_s) * 1000

    def jvm_ms(self, seconds: float | None) -> str:
        """``seconds`` of the whole run per txid, in milliseconds (``-``: unknown)."""
        return "-" if seconds is None else f"{seconds / (len(self.timings) + 1) * 1000:,.0f}"


@dataclass
class Floor:
    """One floor case's seconds per ``SMALL``-record batch."""

    name: str
    samples_s: list[float]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_s) * 1000


def _timed(rounds: int, warm_up: int, one: Callable[[int], object]) -> list[float]:
    """Seconds of each of ``rounds`` calls of ``one(k)``, after ``warm_up`` left out."""
    samples = []
    for k in range(warm_up + rounds):
        began = time.perf_counter()
        one(k)
        if k >= warm_up:
            samples.append(time.perf_counter() - began)
    return samples


def measure_floor(
    spark: Any, bootstrap: str, rounds: int, progress: Progress, warm_up: int = FLOOR_WARM_UP
) -> list[Floor]:
    """What a ``SMALL``-record batch costs below the framework, in this (warmed) JVM: a
    Structured Streaming micro-batch doing the latency topology's count, one Spark job
    that reads the batch from Kafka and collects it, one Spark job of nothing."""
    import json

    from pyspark.sql import functions as F

    from benchmarks.latency_topology import bucket_of

    batches = warm_up + rounds
    topic = f"floor-{uuid.uuid4().hex[:8]}"
    progress(f"breakdown: floor: writing {SMALL * batches:,} events")
    _produce(bootstrap, topic, 1, SMALL * batches)
    count = bucket_of(F.col("value").cast("string")).alias("bucket")

    def kafka_read(k: int) -> Any:
        start, end = ({topic: {"0": SMALL * k + d}} for d in (0, SMALL))
        return (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("assign", json.dumps({topic: [0]}))
            .option("startingOffsets", json.dumps(start))
            .option("endingOffsets", json.dumps(end))
            .option("kafka.group.id", f"transactional-{topic}")
            .load()
            .select("value")
        )

    progress("breakdown: floor: a Spark job reading a batch from Kafka")
    read = Floor(
        "one Spark job: the batch read from Kafka and collected",
        _timed(rounds, warm_up, lambda k: kafka_read(k).toArrow()),
    )
    planned = Floor(
        "of it: the read planned (Spark's Kafka relation asks the broker)",
        _timed(
            rounds,
            warm_up,
            lambda k: kafka_read(batches - 1 - k)._jdf.queryExecution().executedPlan(),
        ),
    )
    progress("breakdown: floor: a Spark job of nothing")
    nothing = Floor(
        "one Spark job of nothing (`spark.range(10)` collected)",
        _timed(rounds, warm_up, lambda k: spark.range(SMALL).toArrow()),
    )
    progress(f"breakdown: floor: Structured Streaming, {batches} micro-batches")
    checkpoint = WORK / f"floor-{topic}"
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", SMALL)
        .load()
        .writeStream.foreachBatch(
            lambda batch, _: batch.select(count).groupBy("bucket").count().collect()
        )
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        query.processAllAvailable()
        done = [p for p in query.recentProgress if p["numInputRows"] == SMALL]
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    micro = Floor(
        "Structured Streaming: a micro-batch (`triggerExecution`)",
        [p["durationMs"]["triggerExecution"] / 1000 for p in done[-rounds:]],
    )
    return [micro, read, planned, nothing]


def _jvm_times(spark: Any) -> tuple[float, float] | None:
    """The driver JVM's CPU seconds so far and its JIT compilers' (None: a session with
    no JVM in this process)."""
    import psutil

    try:
        jvm = spark._jvm
        times = psutil.Process(jvm.java.lang.ProcessHandle.current().pid()).cpu_times()
        compiled = jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
        return times.user + times.system, compiled.getTotalCompilationTime() / 1000
    except (AttributeError, psutil.Error):
        return None


def _produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    from benchmarks.latency import _flush, _new_topic, _producer

    _new_topic(bootstrap, topic, partitions)
    producer = _producer(bootstrap)
    ms = int(time.time() * 1000)
    for i in range(per_partition * partitions):
        producer.produce(topic, str(ms + i).encode(), partition=i % partitions)
        if i % 10_000 == 0:
            producer.poll(0)
            producer.flush(30)
    _flush(producer)


def measure_one(
    spark: Any,
    bootstrap: str,
    redis_url: str,
    name: str,
    records: int,
    partitions: int,
    txids: int,
    progress: Progress,
    plan_once: bool = True,
) -> Breakdown:
    from benchmarks import latency_topology
    from coordinators import SQLiteStateStore
    from transactional.config import RunnerConfig
    from transactional.runner import TransactionalRunner

    run = uuid.uuid4().hex[:8]
    topic = f"breakdown-{run}"
    per_partition = records // partitions
    progress(f"breakdown: {name}: writing {per_partition * partitions * txids:,} events")
    _produce(bootstrap, topic, partitions, per_partition * txids)
    work = WORK / run
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    os.environ.update(
        LATENCY_KAFKA=bootstrap,
        LATENCY_TOPIC=topic,
        LATENCY_REDIS_URL=redis_url,
        LATENCY_KEY_PREFIX=f"breakdown:{run}:",
    )
    topology = latency_topology.build(batch_size=per_partition, plan_once=plan_once)
    commits: list[float] = []

    class Commits:
        def on_commit(self, txid: int, records: int) -> None:
            commits.append(time.perf_counter())

    runner = TransactionalRunner(
        topology,
        SQLiteStateStore(work / "state.db"),
        spark,
        RunnerConfig(topology_id=f"breakdown-{run}", max_pending=1, poll_interval_s=0.01),
        listener=Commits(),
    )
    before = _jvm_times(spark)
    stats = runner.run(until_drained=True)
    after = _jvm_times(spark)
    timings = [t for t in stats.timings if t.txid > 1]  # the first: warm-up of every plan
    gaps = [b - a for a, b in itertools.pairwise(commits[1:])]  # from the second on
    result = Breakdown(name, per_partition * partitions, partitions, timings, gaps)
    if before is not None and after is not None:
        result.jvm_cpu_s, result.jit_s = after[0] - before[0], after[1] - before[1]
    progress(f"breakdown: {name}: {stats.committed_txids} txids, {stats.records:,} records")
    shutil.rmtree(work, ignore_errors=True)
    return result


def measure(
    spark: Any,
    progress: Progress,
    txids: int = TXIDS,
    large: int = LARGE,
    bootstrap_servers: str | None = None,
    redis_url: str | None = None,
    warm_up: int = WARM_UP,
    floor_warm_up: int = FLOOR_WARM_UP,
) -> tuple[list[Breakdown], list[Floor]]:
    """A small and a large txid's breakdown, after ``warm_up`` small txids left out,
    then the floor of a small batch (``measure_floor``); a Kafka broker and a Redis
    server started for it when not given."""
    from benchmarks.latency import servers

    cases = [
        ("small", SMALL, 1, True),
        (EACH_TXID, SMALL, 1, False),
        ("large", large, PARTITIONS, True),
    ]
    with servers(bootstrap_servers, redis_url) as (kafka, redis):
        if warm_up:
            measure_one(spark, kafka, redis, "warm-up", SMALL, 1, warm_up, progress)
        results = [
            measure_one(spark, kafka, redis, name, n, p, txids + 1, progress, plan_once=once)
            for name, n, p, once in cases
        ]
        floor = measure_floor(spark, kafka, txids, progress, floor_warm_up)
    return results, floor


def table(results: Sequence[Breakdown]) -> list[str]:
    head = " | ".join(f"{title} ms" for title, _ in STEPS)
    lines = [
        f"| txid | records | txids | {head} | Spark jobs | commit to commit ms | "
        "JVM CPU ms | of it JIT ms |",
        "|---|---:|---:|" + "---:|" * (len(STEPS) + 4),
    ]
    for r in results:
        jobs = [t.jobs for t in r.timings if t.jobs is not None]
        steps = " | ".join(f"{r.median_ms(field):,.1f}" for _, field in STEPS)
        lines.append(
            f"| {r.name} | {r.records:,} | {len(r.timings)} | {steps} | "
            f"{statistics.median(jobs) if jobs else '-'} | {r.per_txid_ms:,.1f} | "
            f"{r.jvm_ms(r.jvm_cpu_s)} | {r.jvm_ms(r.jit_s)} |"
        )
    return lines


def floor_table(small: Breakdown, floor: Sequence[Floor]) -> list[str]:
    """A small txid beside the floor of a batch its size, as medians and as ratios."""
    lines = [
        f"| a {SMALL}-record batch | batches | ms | x the framework's txid |",
        "|---|---:|---:|---:|",
        f"| the framework: a txid, commit to commit | {len(small.gaps_s)} | "
        f"{small.per_txid_ms:,.1f} | 1.00 |",
    ]
    for case in floor:
        ratio = case.median_ms / small.per_txid_ms
        lines.append(
            f"| {case.name} | {len(case.samples_s)} | {case.median_ms:,.1f} | {ratio:.2f} |"
        )
    return lines


def section(
    results: Sequence[Breakdown],
    floor: Sequence[Floor] = (),
    warm_up: int = WARM_UP,
    floor_warm_up: int = FLOOR_WARM_UP,
) -> list[str]:
    return [
        "## Where a txid's time goes, Kafka to Redis (max_pending=1, medians per txid)",
        "",
        *table(results),
        "",
        "The latency benchmark's topology in one process, one txid at a time, over a topic "
        f"written in full first, after {warm_up:,} small txids left out (the JVM compiles "
        "Spark's planning code for minutes); the runner's own timings, each run's first "
        "txid (every plan's first run) left out. `decide`: the spout's decision on the coordinator thread "
        "(Kafka's offsets asked), `store` within it: its metadata written; `read (emit)`: "
        "the batch read, counted, digested and kept; `process`: the bolts' and the "
        "committers' plans, built once and re-pointed at the batch (the bolt plans once: "
        f"`Bolt.plan_once`), or built anew in every txid (`{EACH_TXID}`); "
        "`prepare`: the committers' frames collected and prepared; `verify`: the "
        "determinism check; `queued`: processed until its commit began; `commit`: the "
        "Redis script; `advance`: the store moved past it. `commit to commit`: the wall "
        "time from one txid's commit to the next's (steps run one after the other). "
        "`JVM CPU`: the driver JVM's CPU time over the run per txid (every thread: "
        "Spark's planning, the tasks, the JIT compilers); `of it JIT`: the compilers'.",
        "",
        *_floor_section(results, floor, floor_warm_up),
    ]


def _floor_section(results: Sequence[Breakdown], floor: Sequence[Floor], warm_up: int) -> list[str]:
    small = next((r for r in results if r.name == "small"), None)
    if small is None or not floor:
        return []
    return [
        f"### The floor of a {SMALL}-record batch (same JVM, medians)",
        "",
        *floor_table(small, floor),
        "",
        f"Measured after the txids above, each case after {warm_up:,} rounds of its own "
        "left out. Structured Streaming reads the same kind of topic "
        f"(`maxOffsetsPerTrigger` {SMALL}) and counts it in `foreachBatch` as the "
        "latency benchmark's anchor does; `triggerExecution` is its whole micro-batch "
        "(offsets logged, planned, run, committed). The Spark jobs are what any engine "
        "that runs one Spark job per batch pays at the least: the batch's records "
        "read by Spark's Kafka reader and collected (one query planned, one job), of it "
        "the planning alone (the physical plan, where Spark's Kafka relation opens a "
        "client of its own and asks the broker for the partitions), and a job with no "
        "input at all.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.breakdown", description=__doc__)
    parser.add_argument("--txids", type=int, default=TXIDS)
    parser.add_argument("--large", type=int, default=LARGE)
    parser.add_argument(
        "--warm-up", type=int, default=WARM_UP, help="small txids run first, left out"
    )
    parser.add_argument(
        "--floor-warm-up", type=int, default=FLOOR_WARM_UP,
        help="rounds of each floor case run first, left out",
    )  # fmt: skip
    parser.add_argument("--conf", action="append", default=[], help="KEY=VALUE for Spark")
    parser.add_argument("--section", action="store_true", help="print RESULTS.md's section")
    args = parser.parse_args(argv)
    from transactional.sources.kafka import kafka_spark_conf
    from transactional.spark.session import create_spark_session, merged

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    extra = dict(item.split("=", 1) for item in args.conf)
    spark = create_spark_session("local[*]", "breakdown", merged(kafka_spark_conf(), extra))
    try:
        results, floor = measure(
            spark, progress, args.txids, args.large, warm_up=args.warm_up,
            floor_warm_up=args.floor_warm_up,
        )  # fmt: skip
    finally:
        spark.stop()
    if args.section:
        print("\n".join(section(results, floor, args.warm_up, args.floor_warm_up)))
    else:
        small = [r for r in results if r.name == "small"]
        print("\n".join([*table(results), "", *floor_table(small[0], floor)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
