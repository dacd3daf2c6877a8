"""What a txid keeps in Spark (its materialised batch, a bolt's own local checkpoint)
is released once the txid is committed or its attempt dropped, and nothing made
before the attempt (a checkpoint a spout keeps across txids) is touched. Checked
against Spark's own list of persisted RDDs, on a real session and a real Redis sink."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from coordinators import SQLiteStateStore
from tests.integration.topologies import BATCH, TOTAL, BucketBolt, RangeSpout, expected_counts
from tests.witness import server_persisted, waited
from transactional import Bolt, RunnerConfig, TopologyBuilder, TransactionalRunner, checkpoint
from transactional.errors import InjectedFault
from transactional.faults import FaultPoint
from transactional.types import TransactionAttempt

pytestmark = [pytest.mark.integration, pytest.mark.connect]


def persisted(spark: Any) -> set[int]:
    """The ids of the RDDs the Spark context holds persisted now."""
    ids = spark.sparkContext._jsc.sc().getPersistentRDDs().keySet().iterator()
    found = set()
    while ids.hasNext():
        found.add(int(ids.next()))
    return found


class KeepingBolt(Bolt):
    """Keeps its input with a lazy ``localCheckpoint`` (as the tweet bolts do) and
    records the RDD each keep added to the context's persisted set."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.lock = threading.Lock()
        self.kept: list[int] = []

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        with self.lock:
            before = persisted(self.spark)
            kept = batch.select("id").localCheckpoint(eager=False)
            self.kept += sorted(persisted(self.spark) - before)
        return kept


class FailOnce:
    """An exception at ``point`` on the first attempt of ``txid``."""

    def __init__(self, point: FaultPoint, txid: int) -> None:
        self.point, self.txid, self.failed = point, txid, 0

    def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        if point is self.point and attempt.txid == self.txid and number == 1:
            self.failed += 1
            raise InjectedFault(f"injected at {point.value} of txid {attempt.txid}")


class SlicedSpout(RangeSpout):
    """Every batch a slice of one frame kept (checkpointed eagerly) when the spout opens."""

    def open(self, context: Any) -> None:
        super().open(context)
        before = persisted(self.spark)
        self.base = self.spark.range(0, self.total, numPartitions=2).localCheckpoint(eager=True)
        (self.base_rdd,) = persisted(self.spark) - before

    def emit_batch(self, attempt: TransactionAttempt, meta: Any) -> DataFrame:
        return self.base.where((F.col("id") >= meta.start) & (F.col("id") < meta.end))


def run(
    spark: Any,
    url: str,
    path: Path,
    spout: RangeSpout,
    bolt: Bolt,
    faults: Any,
    sink: Any = None,
    joined: bool = True,
    **config: Any,
) -> Any:
    """The topology run to its end (``sink``: the Redis sink at ``url`` by default;
    ``joined``: and its threads after it, as a test may ask, unlike a command)."""
    from committers import CounterTable, RedisCommitter

    redis.Redis.from_url(url).flushdb()
    if sink is None:
        sink = RedisCommitter(url, {"default": CounterTable("buckets", ("key",))})
    topology = (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("keep", bolt)
        .set_bolt("bucket", BucketBolt(), "keep")
        .set_committer("sink", sink, "bucket")
        .build()
    )
    settings = RunnerConfig(topology_id="kept", max_pending=2, backoff_initial_s=0.05, **config)
    runner = TransactionalRunner(
        topology, SQLiteStateStore(path / "state.db"), spark, settings, faults=faults
    )
    stats = runner.run(until_drained=True)
    if joined:
        runner.join()  # an attempt dropped while processing may report after the run
    return stats


def buckets(url: str) -> dict[str, int]:
    client = redis.Redis.from_url(url, decode_responses=True)
    return {k: int(v) for k, v in client.hgetall("buckets").items()}


@pytest.mark.classic
@pytest.mark.parametrize("point", [FaultPoint.PROCESS, FaultPoint.BEFORE_SINK_WRITE])
def test_every_checkpoint_of_a_txid_is_released_when_it_is_committed_or_dropped(
    spark: Any, redis_url: str, tmp_path: Path, point: FaultPoint
) -> None:
    before = persisted(spark)
    bolt, faults = KeepingBolt(spark), FailOnce(point, 3)
    stats = run(spark, redis_url, tmp_path, RangeSpout(), bolt, faults)

    assert buckets(redis_url) == expected_counts()
    assert stats.committed_txids == TOTAL // BATCH and faults.failed == 1
    # A keep per attempt processed (the failed one and its retry both, and a txid
    # after it dropped with it): all of them made by this run.
    assert len(bolt.kept) >= TOTAL // BATCH + 1
    assert not set(bolt.kept) & before
    # Nothing the run made is still held: the bolt's keeps and the engine's batches.
    assert persisted(spark) - before == set()


@pytest.mark.classic
def test_a_clean_end_has_released_everything_when_the_run_returns(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    """The caller may stop Spark as soon as ``run`` returns (the demo and ``transactional
    run`` do): no release is left under way then, to fail against a stopped context."""
    before = persisted(spark)
    bolt = KeepingBolt(spark)
    stats = run(spark, redis_url, tmp_path, RangeSpout(), bolt, None, joined=False)
    assert persisted(spark) - before == set()  # at once: no join, no wait
    assert buckets(redis_url) == expected_counts()
    assert stats.committed_txids == TOTAL // BATCH
    assert bolt.kept and not set(bolt.kept) & before  # the bolt's keeps were made


@pytest.mark.classic
def test_the_checkpoint_of_a_batch_whose_reading_is_cancelled_is_released(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    """The first attempt of txid 2 reads its batch far past its timeout (a UDF sleeping
    600 s): the runner cancels the job that stores the batch's checkpoint, which the
    attempt never gets back to release."""
    before = persisted(spark)
    spout, bolt = RangeSpout(slow_txid=2), KeepingBolt(spark)
    began = time.monotonic()
    stats = run(spark, redis_url, tmp_path, spout, bolt, None, attempt_timeout_s=15.0)

    # The slow read was emitted once, and cut short: the run ended long before it would.
    assert spout.slowed == 1 and time.monotonic() - began < 300
    assert buckets(redis_url) == expected_counts()
    assert stats.committed_txids == TOTAL // BATCH
    assert persisted(spark) - before == set()


@pytest.mark.classic
def test_a_checkpoint_the_spout_made_before_the_txids_is_kept(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    spout, bolt = SlicedSpout(), KeepingBolt(spark)
    stats = run(spark, redis_url, tmp_path, spout, bolt, FailOnce(FaultPoint.PROCESS, 2))

    # Every txid read its slice of the spout's frame: had a release dropped its blocks,
    # the next txid's read would fail (CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND) on every attempt.
    assert buckets(redis_url) == expected_counts()
    assert stats.committed_txids == TOTAL // BATCH
    assert spout.base_rdd in persisted(spark)
    assert not set(bolt.kept) & persisted(spark)
    assert spout.base.count() == TOTAL


class CheckpointingBolt(Bolt):
    """Keeps its input through ``transactional.checkpoint`` (a persisted frame on
    Spark Connect), read by a job of its own so that it is stored."""

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        kept = checkpoint(batch.select("id"))
        kept.count()
        return kept


class ServerKeeps:
    """The RDDs a Spark Connect server stores beyond those it held before, watched
    through its REST API (``server_persisted``) every 0.1 s while the block runs."""

    def __init__(self, ui_port: int) -> None:
        self.ui = ui_port
        self.before = server_persisted(ui_port)
        self.seen: set[int] = set()
        self._done = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.wait(0.1):
            self.seen.update(server_persisted(self.ui) - self.before)

    def __enter__(self) -> ServerKeeps:
        self._watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._watcher.join()

    def wait_none_left(self) -> None:
        """Unpersisting is asynchronous, and so is the server's view of it: waited for."""
        waited(
            "the server holding none of the run's RDDs",
            lambda: True if not server_persisted(self.ui) - self.before else None,
            timeout=30,
        )


@pytest.mark.connect_only
def test_on_spark_connect_what_a_txid_kept_is_unpersisted_on_the_server_once_it_is_over(
    spark: Any, spark_connect: Any, redis_url: str, tmp_path: Path
) -> None:
    """The server's own list of persisted RDDs (its REST API), watched through the run:
    the engine's batches and the bolt's keeps were stored on the server, and none of
    them is left once the run is over (the first attempt of txid 3 failed too)."""
    faults = FailOnce(FaultPoint.PROCESS, 3)
    with ServerKeeps(int(spark_connect.conf["spark.ui.port"])) as server:
        stats = run(spark, redis_url, tmp_path, RangeSpout(), CheckpointingBolt(), faults)
    assert buckets(redis_url) == expected_counts()
    assert stats.committed_txids == TOTAL // BATCH and faults.failed == 1
    assert len(server.seen) >= TOTAL // BATCH  # the run's frames were stored on the server
    server.wait_none_left()


@pytest.mark.connect_only
def test_on_spark_connect_what_the_delta_merge_path_kept_is_unpersisted_on_the_server(
    spark: Any, spark_connect: Any, redis_url: str, tmp_path: Path
) -> None:
    """As above, with every txid merged by the server (a Delta committer with
    ``max_driver_rows=0``): the sums kept for each MERGE and Delta's own copy of them are
    stored on the server, and none is left once the run is over."""
    from deltalake import DeltaTable

    from committers import CounterTable, DeltaCommitter

    sink = DeltaCommitter(
        str(tmp_path / "lake"), {"default": CounterTable("buckets", ("key",))}, max_driver_rows=0
    )
    faults = FailOnce(FaultPoint.PROCESS, 3)
    with ServerKeeps(int(spark_connect.conf["spark.ui.port"])) as server:
        stats = run(spark, redis_url, tmp_path, RangeSpout(), CheckpointingBolt(), faults, sink)
    rows = DeltaTable(str(tmp_path / "lake" / "buckets")).to_pyarrow_table().to_pylist()
    assert {r["key"]: r["count"] for r in rows} == expected_counts()
    assert stats.committed_txids == TOTAL // BATCH and faults.failed == 1
    assert len(server.seen) >= TOTAL // BATCH
    server.wait_none_left()
