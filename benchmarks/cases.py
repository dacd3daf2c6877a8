"""The measured cases. Each does the same work on the same input: parse the tweets,
count hashtags, users and (user, hashtag) pairs, and add the counts into the same sink
through the same committer code, so only the way batches are driven differs."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from examples.tweets.bolts import CountTags, ParseTweets
from examples.tweets.topology import build_topology
from transactional.committer import CommitterContext
from transactional.types import CommitMode, Guarantee, TransactionAttempt


@dataclass
class Case:
    name: str
    sink: str
    run: Callable[[], int]  # returns the number of input records processed
    note: str = ""
    #: Framework cases: the per-txid step timings of the last run (RunStats.timings).
    timings: list[Any] = field(default_factory=list)
    #: Framework cases: commits of two or more txids as one (commit groups), last run.
    grouped: int = 0


def count_lines(data: Path) -> int:
    total = 0
    for file in sorted(data.iterdir()):
        if file.is_file() and not file.name.startswith((".", "_")):
            with file.open("rb") as f:
                total += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    return total


def _committer(
    sink: str,
    redis_url: str,
    work: Path,
    mode: CommitMode = CommitMode.TRANSACTIONAL,
    anchor: bool = False,
) -> Any:
    """A fresh sink for one timed run: a flushed Redis database or a new Delta directory.
    ``anchor``: the sink as a Spark user would write it without this framework; for Delta
    that is delta-spark's MERGE with ``txnAppId``/``txnVersion`` (the committer's own
    delta-spark path), not the framework's delta-rs path."""
    from committers import DeltaCommitter
    from examples.tweets.commands import make_committer
    from examples.tweets.sinks import DEAD_LETTERS, counter_tables

    if sink == "redis":
        import redis

        redis.Redis.from_url(redis_url).flushdb()
        return make_committer("redis", mode, delta_path=None, redis_url=redis_url)
    path = str(work / f"delta-{uuid.uuid4().hex[:8]}")
    if anchor:
        tables = counter_tables()
        return DeltaCommitter(path, tables, dead_letters=DEAD_LETTERS, mode=mode, max_driver_rows=0)
    return make_committer("delta", mode, delta_path=path, redis_url=None)


def _fresh(work: Path) -> Path:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def _open(committer: Any, spark: Any, topology_id: str) -> None:
    committer.open(CommitterContext(spark, topology_id, "sink"))


def _commit_batch(committer: Any, txid: int, batch: DataFrame) -> None:
    """What one transaction does to a batch of raw lines, outside the framework: the same
    bolts and the same committer (with its txid check), in one thread."""
    attempt = TransactionAttempt(txid, 0)
    parse, count = ParseTweets(), CountTags()
    parsed = parse.finish_batch(attempt, parse.process(attempt, batch))
    counted = count.finish_batch(attempt, count.process(attempt, parsed["default"]))
    inputs = {**counted, "dead_letters": parsed["dead_letters"]}
    committer.commit(attempt, committer.prepare(attempt, inputs))


def _raw(df: DataFrame) -> DataFrame:
    """The lines as the bolts read them; with null ledger ids, as with the ledger off
    (the bolts account for their records, and read the id column)."""
    from transactional.ledger import with_ids

    return with_ids(
        df.select(F.col("value").alias("raw"), F.lit(None).cast("string").alias("error")),
        null=True,
    )


def bare_spark(spark: Any, data: Path, sink: str, redis_url: str, work: Path, **_: Any) -> Case:
    total = count_lines(data)

    def run() -> int:
        committer = _committer(sink, redis_url, _fresh(work), anchor=True)
        _open(committer, spark, "bench-bare")
        _commit_batch(committer, 1, _raw(spark.read.text(str(data))))
        return total

    return Case("bare spark (no guarantee)", sink, run, "all input in one batch, one write")


#: The anchor that runs Structured Streaming's batches one after the other, bare.
LOOP = "batches in a loop (no guarantee)"


def batches_in_a_loop(
    spark: Any, data: Path, sink: str, redis_url: str, work: Path, **_: Any
) -> Case:
    """Structured Streaming's batches (a file each) through the same bolts and committer,
    one after the other, with nothing around them: no source offsets, no checkpoint, no
    batch kept. The work of the batches themselves, which any scheduler of them does."""
    total = count_lines(data)
    files = sorted(f for f in data.iterdir() if f.is_file() and not f.name.startswith((".", "_")))

    def run() -> int:
        committer = _committer(sink, redis_url, _fresh(work), anchor=True)
        _open(committer, spark, "bench-loop")
        for txid, file in enumerate(files, start=1):
            _commit_batch(committer, txid, _raw(spark.read.text(str(file))))
        return total

    return Case(LOOP, sink, run, "one file a batch, in order, each as one write; nothing else")


def structured_streaming(
    spark: Any, data: Path, sink: str, redis_url: str, work: Path, **_: Any
) -> Case:
    total = count_lines(data)

    def run() -> int:
        base = _fresh(work)
        committer = _committer(sink, redis_url, base, anchor=True)
        _open(committer, spark, "bench-ss")
        query = (
            _raw(spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(data)))
            .writeStream.foreachBatch(
                lambda df, batch_id: _commit_batch(committer, batch_id + 1, df)
            )
            .option("checkpointLocation", str(base / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"structured streaming failed: {query.exception()}")
        return total

    return Case(
        "structured streaming",
        sink,
        run,
        "file source, maxFilesPerTrigger=1, checkpoint dir, foreachBatch with the "
        "committer's idempotent txid check (txid = batch id + 1)",
    )


#: Suffix of the case run without the determinism check (the others run with it).
NO_CHECK = "no determinism check"
#: The guarantees below exactly-once: their cases are not candidates for the
#: exactly-once targets, and are compared with the exactly-once case on their own.
WEAKER = ("at_least_once", "at_most_once")
#: Suffix of the case run without the record ledger (the others run with it).
NO_LEDGER = "no ledger"
#: The framework case on the transactional file spout (the others are partitioned).
SEQUENCE = "file sequence"

#: The latency --batch-size auto keeps each txid under in the benchmark.
AUTO_TARGET_S = 30.0


def framework(
    spark: Any,
    data: Path,
    sink: str,
    redis_url: str,
    work: Path,
    partitions: int,
    per_txid: int,
    max_pending: int,
    auto: bool = False,
    check_determinism: bool = True,
    sequence: bool = False,
    guarantee: str = "exactly_once",
    ledger: bool = True,
    **_: Any,
) -> Case:
    """``sequence``: the transactional file spout, ``per_txid`` lines a txid (one file of
    the benchmark's dataset, as Structured Streaming takes one a trigger); otherwise the
    partitioned file spout, ``per_txid / partitions`` lines per partition."""
    from coordinators import SQLiteStateStore
    from transactional.config import RunnerConfig
    from transactional.flow import AdaptiveBatchSize, BatchSizeConfig
    from transactional.runner import TransactionalRunner
    from transactional.sources.files import FilesPartitionedSpout, FilesTransactionalSpout

    per_partition = max(1, per_txid // partitions)

    def run() -> int:
        base = _fresh(work)
        committer = _committer(sink, redis_url, base)
        spout = (
            FilesTransactionalSpout(data, per_txid)
            if sequence
            else FilesPartitionedSpout(data, per_partition)
        )
        sizer = None
        if auto:
            sizer = AdaptiveBatchSize(
                BatchSizeConfig(
                    initial=max(100, per_partition // 4),
                    minimum=100,
                    step=max(100, per_partition // 4),
                    maximum=per_partition * 4,
                    target_latency_s=AUTO_TARGET_S,
                )
            )
        runner = TransactionalRunner(
            build_topology(spout, committer),
            SQLiteStateStore(base / "state.db"),
            spark,
            RunnerConfig(
                topology_id="bench",
                max_pending=max_pending,
                check_determinism=check_determinism,
                guarantee=Guarantee(guarantee),
                ledger=ledger,
            ),
            batch_size=sizer,
        )
        stats = runner.run(until_drained=True)
        case.timings = list(stats.timings)
        case.grouped = stats.grouped_commits
        return stats.records

    name = "framework, batch auto" if auto else f"framework, max_pending={max_pending}"
    if guarantee != "exactly_once":
        name = f"framework, {guarantee}, max_pending={max_pending}"
    if sequence:
        name = f"framework, {SEQUENCE}, max_pending={max_pending}"
    if not check_determinism:
        name += f", {NO_CHECK}"
    if not ledger:
        name += f", {NO_LEDGER}"
    note = (
        f"partitioned file spout, {per_partition} lines per partition per txid "
        f"({per_partition * partitions} per txid), SQLite store"
    )
    if sequence:
        note = (
            f"transactional file spout (the directory as one sequence), {per_txid} lines per "
            "txid; a txid that is a whole file followed by another is read by Spark's text "
            "reader, the last file by the range reader; SQLite store"
        )
    if auto:
        note = (
            f"partitioned file spout, --batch-size auto (slow start to the delivery rate's plateau, then probing, target {AUTO_TARGET_S:.0f} s per "
            "txid), SQLite store"
        )
    case = Case(name, sink, run, note)
    return case
