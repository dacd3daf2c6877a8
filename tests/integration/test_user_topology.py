"""A user's own topology on real Spark: broken contracts refused at their first
occurrence, the determinism check across a crash with the SQLite store, and an idle
source that leaves the store, Redis and Delta untouched while it polls."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from committers import CounterTable, DeltaCommitter, RedisCommitter
from coordinators import SQLiteStateStore
from tests.integration.topologies import BucketBolt, RangeSpout
from transactional import (
    Bolt,
    CommitMode,
    CommitOutcome,
    Committer,
    OpaquePartitionedTransactionalSpout,
    PartitionedTransactionalSpout,
    RunnerConfig,
    TopologyBuilder,
    TransactionalRunner,
)
from transactional.errors import BatchConfigurationError, ContractError, NondeterministicSpoutError
from transactional.faults import FaultPoint
from transactional.testing import FaultPlan, Range, TopologyHarness
from transactional.types import TransactionAttempt

pytestmark = [pytest.mark.integration, pytest.mark.connect]
MODULE = "tests.integration.test_user_topology"


class PandasSpout(RangeSpout):
    def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> Any:
        return super().emit_batch(attempt, meta).toPandas()  # a pandas frame, not Spark's


class NoneBolt(Bolt):
    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> Any:
        batch.groupBy("id").count()  # built, but not returned


class BareOpaque(OpaquePartitionedTransactionalSpout[Range]):
    metadata_type = Range

    def open(self, context: Any) -> None:
        self.spark: SparkSession = context.spark

    def num_partitions(self) -> int:
        return 1

    def emit_partition_batch(self, attempt: Any, partition: int, last_meta: Any) -> Any:
        start = last_meta.end if last_meta else 0
        return self.spark.range(start, start + 10)  # the metadata is missing


class Rows(Committer):
    """Collects the rows of its one input per txid, in memory (transactional mode)."""

    def __init__(self) -> None:
        self.last_txid = 0
        self.counts: Counter[Any] = Counter()

    def commit(self, attempt: TransactionAttempt, prepared: Any) -> CommitOutcome:
        if attempt.txid <= self.last_txid:
            return CommitOutcome.SKIPPED
        for row in prepared["default"].collect():
            self.counts[row["key"]] += row["count"]
        self.last_txid = attempt.txid
        return CommitOutcome.APPLIED


class OpaqueRows(Rows):
    mode = CommitMode.OPAQUE


def refused(spark: Any, topology: Any, tmp_path: Path) -> str:
    config = RunnerConfig(topology_id="user", max_pending=1, max_attempts=5, backoff_max_s=0.1)
    runner = TransactionalRunner(topology, SQLiteStateStore(tmp_path / "s.db"), spark, config)
    with pytest.raises(BatchConfigurationError) as info:
        runner.run(until_drained=True)
    assert isinstance(info.value.cause, ContractError)
    assert runner.stats.failures == 1 and runner.stats.committed_txids == 0
    return str(info.value.cause)


def test_a_pandas_frame_from_a_spout_is_refused_at_once(spark: Any, tmp_path: Path) -> None:
    topology = (
        TopologyBuilder()
        .set_spout(PandasSpout())
        .set_bolt("bucket", BucketBolt())
        .set_committer("sink", Rows(), "bucket")
        .build()
    )
    assert refused(spark, topology, tmp_path) == (
        f"spout 'spout' ({MODULE}.PandasSpout).emit_batch returned "
        "pandas.core.frame.DataFrame, not a pyspark.sql.DataFrame of the runner's "
        "session: convert it with spark.createDataFrame(...) on the SparkSession the runner "
        "gives at open (txid 1)"
    )


def test_a_bolt_returning_none_is_refused_at_once(spark: Any, tmp_path: Path) -> None:
    topology = (
        TopologyBuilder()
        .set_spout(RangeSpout())
        .set_bolt("bucket", NoneBolt())
        .set_committer("sink", Rows(), "bucket")
        .build()
    )
    assert refused(spark, topology, tmp_path).startswith(
        f"bolt 'bucket' ({MODULE}.NoneBolt).process returned None (txid 1); it must return a "
        "DataFrame"
    )


def test_an_opaque_spout_returning_a_bare_frame_is_refused_at_once(
    spark: Any, tmp_path: Path
) -> None:
    topology = (
        TopologyBuilder()
        .set_spout(BareOpaque())
        .set_bolt("bucket", BucketBolt())
        .set_committer("sink", OpaqueRows(), "bucket")
        .build()
    )
    frame = type(spark.range(1))  # classic or Spark Connect's
    assert refused(spark, topology, tmp_path) == (
        f"spout 'spout' ({MODULE}.BareOpaque).emit_partition_batch returned "
        f"{frame.__module__}.{frame.__qualname__} for txid 1 partition 0; it must return a pair "
        "(metadata, DataFrame): (Range(...), the partition's batch)"
    )


# ---------------------------------------------------------------------- determinism


class LineFiles(PartitionedTransactionalSpout[Range]):
    """Each file is a partition, read by line numbers: rewriting a file under stored
    metadata is exactly what the determinism check must catch."""

    metadata_type = Range

    def __init__(self, files: list[Path], batch: int) -> None:
        self.files, self.batch = files, batch

    def open(self, context: Any) -> None:
        self.spark: SparkSession = context.spark

    def num_partitions(self) -> int:
        return len(self.files)

    def is_ready(self, txid: int, last_metas: Mapping[int, Range]) -> bool:
        return any(
            (last_metas[p].end if p in last_metas else 0) < len(f.read_text().splitlines())
            for p, f in enumerate(self.files)
        )

    def emit_partition_batch_new(self, attempt: Any, partition: int, last: Range | None) -> Range:
        start = last.end if last else 0
        lines = len(self.files[partition].read_text().splitlines())
        return Range(start=start, count=max(0, min(self.batch, lines - start)))

    def emit_partition_batch(self, attempt: Any, partition: int, meta: Range) -> DataFrame:
        lines = self.files[partition].read_text().splitlines()[meta.start : meta.end]
        return self.spark.createDataFrame([(line,) for line in lines], "key string")


class CountKeys(Bolt):
    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        return batch.groupBy("key").agg(F.count("*").alias("count"))


def test_a_rewritten_source_stops_the_replay_before_the_second_sink(
    spark: Any, tmp_path: Path
) -> None:
    files = [tmp_path / "p0.txt", tmp_path / "p1.txt"]
    files[0].write_text("".join(f"a{i % 3}\n" for i in range(8)))
    files[1].write_text("".join(f"b{i % 2}\n" for i in range(8)))
    first, second = Rows(), Rows()

    def build() -> Any:
        return (
            TopologyBuilder()
            .set_spout(LineFiles(files, 4))
            .set_bolt("count", CountKeys())
            .set_committer("first", first, "count")
            .set_committer("second", second, "count")
            .build()
        )

    harness = TopologyHarness(build, spark, topology_id="lines", state_dir=tmp_path / "state")
    run = harness.run_until_drained(FaultPlan().crash(FaultPoint.BETWEEN_COMMITTERS, txid=2))
    assert run.crashed and first.last_txid == 2 and second.last_txid == 1
    # Partition 1's second range (lines 4-7) is rewritten: one line fewer, other keys.
    lines = files[1].read_text().splitlines()
    files[1].write_text("\n".join([*lines[:4], "z", "z", "z"]) + "\n")
    with pytest.raises(BatchConfigurationError) as info:
        harness.run_until_drained()
    cause = info.value.cause
    assert isinstance(cause, NondeterministicSpoutError)
    message = str(cause)
    assert f"spout 'spout' ({MODULE}.LineFiles) is not deterministic: the replay of txid 2" in (
        message
    )
    assert "partition 1: first emit 4 records (checksum " in message
    assert "this replay 3 records" in message and "partition 0" not in message
    assert second.last_txid == 1  # the replay reached no sink
    assert second.counts == Counter({"a0": 2, "a1": 1, "a2": 1, "b0": 2, "b1": 2})
    stored = SQLiteStateStore(tmp_path / "state" / "state.db")
    stored.open("lines")
    try:
        digest = stored.read_state().digests[2]
    finally:
        stored.close()
    assert sorted(digest) == ["0", "1"] and digest["1"][0] == 4 and digest["0"][0] == 4


# ---------------------------------------------------------------------- idle sources


class GrowingRange(RangeSpout):
    """Always ready, like a user's spout that does not override ``is_ready``."""

    def __init__(self, total: int, batch: int) -> None:
        super().__init__(total=total, batch=batch)
        self.decisions = 0

    def is_ready(self, txid: int, prev_meta: Range | None) -> bool:
        return True

    def initialize_transaction(self, txid: int, prev_meta: Range | None) -> Range:
        self.decisions += 1
        start = prev_meta.end if prev_meta else 0
        return Range(start=start, count=max(0, min(self.batch, self.total - start)))


def wait_for(condition: Callable[[], bool], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def expected(total: int) -> dict[str, int]:
    return dict(Counter(f"k{n % 7}" for n in range(total)))


def test_200_idle_polls_leave_the_store_and_both_sinks_unchanged(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    spout = GrowingRange(total=250, batch=100)
    redis_sink = RedisCommitter(redis_url, {"default": CounterTable("buckets", ("key",))})
    delta_sink = DeltaCommitter(
        str(tmp_path / "delta"), {"default": CounterTable("buckets", ("key",))}
    )
    topology = (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("bucket", BucketBolt())
        .set_committer("redis", redis_sink, "bucket")
        .set_committer("delta", delta_sink, "bucket")
        .build()
    )
    store = SQLiteStateStore(tmp_path / "state.db")
    config = RunnerConfig(
        topology_id="idle", max_pending=2, poll_interval_s=0.001, poll_max_s=0.005
    )
    runner = TransactionalRunner(topology, store, spark, config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    delta_log = tmp_path / "delta" / "buckets" / "_delta_log"

    def redis_txid() -> str | None:
        return client.get("transactional:idle:redis:txid")

    try:
        wait_for(lambda: runner.stats.last_committed == 3 and runner.stats.empty_polls >= 1)
        before = (sorted(p.name for p in delta_log.iterdir()), redis_txid())
        decisions = spout.decisions
        wait_for(lambda: spout.decisions >= decisions + 200)
        assert (sorted(p.name for p in delta_log.iterdir()), redis_txid()) == before
        reader = SQLiteStateStore(tmp_path / "state.db")
        reader.open("idle")
        try:
            state = reader.read_state()
        finally:
            reader.close()
        assert state.currtx == 4 and sorted(state.metas) == [3] and state.digests == {}

        spout.total = 420  # new data: counted exactly, in the next txids
        wait_for(lambda: runner.stats.last_committed == 5)
    finally:
        runner.stop()
        thread.join(120)
    assert {k: int(v) for k, v in client.hgetall("buckets").items()} == expected(420)
    rows = spark.read.format("delta").load(str(tmp_path / "delta" / "buckets")).collect()
    assert {r["key"]: r["count"] for r in rows} == expected(420)
