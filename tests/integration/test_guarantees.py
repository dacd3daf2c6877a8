"""The spout kinds' table of "Guarantees" (docs/concepts/guarantees.md), cell by cell,
end to end on real Spark, the SQLite store and both real sinks: a transactional and a
partitioned spout into committers of both modes, an opaque spout whose replay emits a
different batch (one that drops whole keys) into an opaque-mode committer, and the
same spout with a transactional-mode committer refused before anything runs. Each run
is crashed right after the sink wrote txid 2, then rerun; the sink must hold exactly
what the committed batches hold, computed here in Python."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from committers import CounterTable, DeltaCommitter, RedisCommitter
from tests.integration.topologies import BucketBolt, RangeSpout
from transactional import (
    OpaquePartitionedTransactionalSpout,
    PartitionedTransactionalSpout,
    TopologyBuilder,
)
from transactional.committer import Committer
from transactional.errors import TopologyValidationError
from transactional.testing import FaultPlan, FaultPoint, Range, TopologyHarness
from transactional.topology import Topology
from transactional.types import CommitMode, TransactionAttempt

pytestmark = [pytest.mark.integration, pytest.mark.connect]

NUMBERS = 240
#: Two partitions: the numbers below and above the half.
HALVES = ((0, NUMBERS // 2), (NUMBERS // 2, NUMBERS))
BATCH = 40  # per partition: three txids; the transactional spout takes 2 * BATCH


def key(n: int) -> str:
    return f"k{n % 7}"  # BucketBolt's rule, written again


class HalvesSpout(PartitionedTransactionalSpout[Range]):
    """Two partitions of numbers, ``BATCH`` per partition and txid, replayed exactly."""

    metadata_type = Range

    def open(self, context: Any) -> None:
        self.spark: SparkSession = context.spark

    def num_partitions(self) -> int:
        return len(HALVES)

    def is_ready(self, txid: int, last_metas: Mapping[int, Range]) -> bool:
        return any(
            (last_metas[p].end if p in last_metas else 0) < end - begin
            for p, (begin, end) in enumerate(HALVES)
        )

    def emit_partition_batch_new(
        self, attempt: TransactionAttempt, partition: int, last_meta: Range | None
    ) -> Range:
        begin, end = HALVES[partition]
        start = last_meta.end if last_meta else 0
        return Range(start=start, count=min(BATCH, end - begin - start))

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, meta: Range
    ) -> DataFrame:
        begin = HALVES[partition][0]
        return self.spark.range(begin + meta.start, begin + meta.end, numPartitions=1)


class ChangingSpout(OpaquePartitionedTransactionalSpout[Range]):
    """An opaque source whose replays differ: the first read of a range gives all of
    its numbers, every later read only those whose key is k0, k1 or k2, so a replay
    drops keys k3 to k6 altogether. ``emitted`` (kept by the test across processes)
    records what the latest emit of each (txid, partition) held."""

    metadata_type = Range

    def __init__(self, reads: Counter[tuple[int, int]], emitted: dict[Any, list[int]]):
        self.reads, self.emitted = reads, emitted

    def open(self, context: Any) -> None:
        self.spark: SparkSession = context.spark

    def num_partitions(self) -> int:
        return len(HALVES)

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, last_meta: Range | None
    ) -> tuple[Range, DataFrame]:
        begin, end = HALVES[partition]
        start = last_meta.end if last_meta else 0
        meta = Range(start=start, count=min(BATCH, end - begin - start))
        self.reads[partition, start] += 1
        numbers = list(range(begin + meta.start, begin + meta.end))
        frame = self.spark.range(begin + meta.start, begin + meta.end, numPartitions=1)
        if self.reads[partition, start] > 1:
            numbers = [n for n in numbers if n % 7 < 3]
            frame = frame.where("id % 7 < 3")
        self.emitted[attempt.txid, partition] = numbers
        return meta, frame


class Sink:
    """One real sink: a counter committer on it in ``mode``, and its contents."""

    def __init__(self, kind: str, spark: SparkSession, redis_url: str, tmp: Path) -> None:
        self.kind, self.spark, self.url, self.path = kind, spark, redis_url, tmp / "delta"
        self.counters = {"default": CounterTable("buckets", ("key",))}
        self.mode = CommitMode.OPAQUE

    def committer(self) -> Committer:
        if self.kind == "redis":
            return RedisCommitter(self.url, self.counters, mode=self.mode)
        return DeltaCommitter(str(self.path), self.counters, mode=self.mode)

    def read_or_none(self) -> dict[str, int] | None:
        """What the sink holds (None: no commit ever reached it)."""
        if self.kind == "redis":
            return self.read() or None
        return self.read() if (self.path / "buckets").exists() else None

    def read(self) -> dict[str, int]:
        if self.kind == "redis":
            return {
                k: int(v)
                for (k,), v in RedisCommitter(self.url, self.counters).read("buckets").items()
            }
        rows = self.spark.read.format("delta").load(str(self.path / "buckets")).collect()
        return {row["key"]: row["count"] for row in rows}


@pytest.fixture(params=["redis", "delta"])
def sink(request: Any, spark: SparkSession, redis_url: str, tmp_path: Path) -> Sink:
    return Sink(request.param, spark, redis_url, tmp_path)


def harness(
    spark: SparkSession, tmp_path: Path, sink: Sink, spout: Callable[[], Any]
) -> TopologyHarness:
    def build() -> Topology:
        return (
            TopologyBuilder()
            .set_spout(spout())
            .set_bolt("bucket", BucketBolt())
            .set_committer("sink", sink.committer(), "bucket")
            .build()
        )

    return TopologyHarness(
        build, spark, topology_id="guarantees", state_dir=tmp_path / "state", strict=True
    )


def crash_and_rerun(
    spark: SparkSession, tmp_path: Path, sink: Sink, spout: Callable[[], Any]
) -> None:
    """Crash right after the sink wrote txid 2, rerun to the end; the rerun must have
    found txid 2 in the sink: skipped it (transactional mode) or undone and redone it
    (opaque mode, ``reapplied``)."""
    runs = harness(spark, tmp_path, sink, spout)
    first = runs.run_until_drained(FaultPlan().crash(FaultPoint.AFTER_SINK_WRITE, txid=2))
    assert first.crashed and first.stats.committed_txids == 1
    second = runs.run_until_drained()
    found = "reapplied" if sink.mode is CommitMode.OPAQUE else "skipped"
    assert second.stats.outcomes[found] == 1, second.stats.outcomes  # txid 2
    assert second.stats.committed_txids == 2  # txids 2 and 3


MODES = pytest.mark.parametrize("mode", [CommitMode.TRANSACTIONAL, CommitMode.OPAQUE], ids=str)


@MODES
def test_a_transactional_spout_into_a_committer_of_either_mode_is_exact(
    spark: SparkSession, tmp_path: Path, sink: Sink, mode: CommitMode
) -> None:
    sink.mode = mode
    crash_and_rerun(spark, tmp_path, sink, lambda: RangeSpout(NUMBERS, 2 * BATCH))
    assert sink.read() == dict(Counter(key(n) for n in range(NUMBERS)))


@MODES
def test_a_partitioned_spout_into_a_committer_of_either_mode_is_exact(
    spark: SparkSession, tmp_path: Path, sink: Sink, mode: CommitMode
) -> None:
    sink.mode = mode
    crash_and_rerun(spark, tmp_path, sink, HalvesSpout)
    assert sink.read() == dict(Counter(key(n) for n in range(NUMBERS)))


def test_an_opaque_spout_whose_replay_drops_keys_is_exact(
    spark: SparkSession, tmp_path: Path, sink: Sink
) -> None:
    reads: Counter[tuple[int, int]] = Counter()
    emitted: dict[Any, list[int]] = {}
    crash_and_rerun(spark, tmp_path, sink, lambda: ChangingSpout(reads, emitted))
    # Txid 2 was read twice, and its replay held none of keys k3 to k6.
    assert reads[0, BATCH] == reads[1, BATCH] == 2
    replayed = {key(n) for p in range(2) for n in emitted[2, p]}
    assert replayed == {"k0", "k1", "k2"}
    # Exactly what the latest emit of each committed txid held: the first attempt of
    # txid 2 (which the sink had written before the crash) counts for nothing.
    expected = Counter(key(n) for numbers in emitted.values() for n in numbers)
    # (The source's empty reads after its end were not committed.)
    assert sorted(k for k, numbers in emitted.items() if numbers) == [
        (t, p) for t in (1, 2, 3) for p in (0, 1)
    ]
    assert sink.read() == dict(expected)


def test_an_opaque_spout_into_a_transactional_mode_committer_is_refused_before_it_runs(
    spark: SparkSession, tmp_path: Path, sink: Sink
) -> None:
    reads: Counter[tuple[int, int]] = Counter()
    sink.mode = CommitMode.TRANSACTIONAL
    runs = harness(spark, tmp_path, sink, lambda: ChangingSpout(reads, {}))
    with pytest.raises(TopologyValidationError) as refused:
        runs.run_until_drained()
    message = str(refused.value)
    assert "cannot give exactly_once" in message and "ChangingSpout is opaque" in message
    assert "--guarantee at_least_once" in message
    # Nothing ran: no read of the source, no txid in the sink.
    assert not reads
    assert sink.read_or_none() is None
