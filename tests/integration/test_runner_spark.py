"""The runner on real Spark, a real SQLite store and a real Redis sink: job groups,
timeouts that cancel Spark jobs, and the ``transactional`` command."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from coordinators import SQLiteStateStore
from tests.integration.topologies import BATCH, TOTAL, RangeSpout, build, expected_counts
from tests.jvm import short_lived
from tests.processes import redis_txid
from tests.witness import spark_settled
from transactional import RunnerConfig, TransactionalRunner
from transactional.testing import Range

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def buckets(url: str) -> dict[str, int]:
    client = redis.Redis.from_url(url, decode_responses=True)
    return {k: int(v) for k, v in client.hgetall("buckets").items()}


def test_a_timed_out_attempt_has_its_spark_jobs_cancelled_and_is_retried(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    spout = RangeSpout(slow_txid=2)
    topology = build(spark, redis_url, spout)
    config = RunnerConfig(
        topology_id="buckets", max_pending=2, attempt_timeout_s=8, backoff_initial_s=0.1
    )
    store = SQLiteStateStore(tmp_path / "state.db")
    stats = TransactionalRunner(topology, store, spark, config).run(until_drained=True)

    assert buckets(redis_url) == expected_counts()
    assert stats.committed_txids == TOTAL // BATCH
    assert stats.failures >= 1 and spout.slowed == 1
    tracker = spark_settled(spark).sparkContext.statusTracker()
    assert tracker.getActiveJobsIds() == []  # the sleeping job did not survive its timeout


def test_a_warm_up_past_the_attempt_timeout_is_cancelled_and_the_run_goes_on(
    spark: Any, redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spout = RangeSpout(slow_sample=True)
    topology = build(spark, redis_url, spout)
    config = RunnerConfig(topology_id="buckets", attempt_timeout_s=5, warm_up=True)
    store = SQLiteStateStore(tmp_path / "state.db")
    with caplog.at_level("WARNING", logger="transactional.runner"):
        stats = TransactionalRunner(topology, store, spark, config).run(until_drained=True)

    assert any("warm-up failed" in r.getMessage() for r in caplog.records)
    assert buckets(redis_url) == expected_counts()
    assert stats.committed_txids == TOTAL // BATCH and stats.failures == 0
    assert spark_settled(spark).sparkContext.statusTracker().getActiveJobsIds() == []


def spark_jobs(spark: Any) -> list[tuple[str | None, str | None]]:
    """(job group, description) of every job the session remembers."""
    jobs = spark_settled(spark).sparkContext._jsc.sc().statusStore().jobsList(None)

    def text(option: Any) -> str | None:
        return str(option.get()) if option.isDefined() else None

    return [
        (text(jobs.apply(i).jobGroup()), text(jobs.apply(i).description()))
        for i in range(jobs.size())
    ]


def test_spark_jobs_say_which_txid_attempt_and_step_they_belong_to(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    topology = build(spark, redis_url, RangeSpout())
    config = RunnerConfig(topology_id="described", max_pending=2)
    store = SQLiteStateStore(tmp_path / "state.db")
    TransactionalRunner(topology, store, spark, config).run(until_drained=True)

    # The session's other jobs belong to other tests: this topology's are found by its
    # name, and each must sit in its txid's job group.
    described: dict[int, set[str]] = {}
    for group, description in spark_jobs(spark):
        if description is None or not description.startswith("described "):
            continue
        _, tx, attempt, step = description.split(" ")
        txid = int(tx.removeprefix("txid="))
        assert group is not None and group.startswith(f"txid-{txid}-"), (group, description)
        assert attempt == "attempt=1"
        described.setdefault(txid, set()).add(step)
    # Every txid's jobs: reading the batch (emit) and collecting its sums (prepare).
    assert sorted(described) == list(range(1, TOTAL // BATCH + 1))
    steps = {"step=emit", "step=process", "step=prepare", "step=commit"}
    assert all({"step=emit", "step=prepare"} <= seen <= steps for seen in described.values())


@pytest.mark.parametrize("spark_at", ["local", "connect"])
@pytest.mark.rotated
def test_the_transactional_command_runs_a_factory_and_reports_status(
    redis_url: str, tmp_path: Path, spark_at: str, request: pytest.FixtureRequest
) -> None:
    """On a local master, and on a Spark Connect server (``--remote``)."""
    env = short_lived({**os.environ, "BUCKETS_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)})
    where = ["--master", "local[2]"]
    if spark_at == "connect":
        where = ["--remote", request.getfixturevalue("spark_connect").remote]
    cli = [sys.executable, "-m", "transactional.cli"]
    run = subprocess.run(
        [
            *cli,
            "run",
            "tests.integration.topologies:build_from_env",
            "--topology-id",
            "buckets",
            "--state-dir",
            str(tmp_path),
            "--until-drained",
            *where,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"committed {TOTAL // BATCH} txids, {TOTAL} records" in run.stdout
    assert buckets(redis_url) == expected_counts()

    status = subprocess.run(
        [*cli, "status", "--topology-id", "buckets", "--state-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    last = TOTAL // BATCH
    assert f"currtx={last + 1}" in status.stdout
    assert f"txid {last} (committed)" in status.stdout


class SampledRangeSpout(RangeSpout):
    """A range spout with a sample for the warm-up; counts how often it is asked."""

    samples = 0

    def sample_batch(self) -> Any:
        SampledRangeSpout.samples += 1
        return self.spark.range(0, 10, numPartitions=2)


def test_the_warm_up_runs_once_per_spark_application_and_topology(
    spark: Any, redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def run(topology_id: str) -> None:
        redis.Redis.from_url(redis_url).flushdb()
        config = RunnerConfig(topology_id=topology_id, max_pending=2, warm_up=True)
        store = SQLiteStateStore(tmp_path / f"{topology_id}-{SampledRangeSpout.samples}.db")
        topology = build(spark, redis_url, SampledRangeSpout())
        stats = TransactionalRunner(topology, store, spark, config).run(until_drained=True)
        assert buckets(redis_url) == expected_counts()
        assert stats.committed_txids == TOTAL // BATCH

    SampledRangeSpout.samples = 0
    with caplog.at_level("INFO", logger="transactional.runner"):
        run("warm-once")
        run("warm-once")  # the same topology again in this application: already warm
        skipped = [r for r in caplog.records if "warm-up skipped" in r.getMessage()]
        assert SampledRangeSpout.samples == 1 and len(skipped) == 1
        run("warm-other")  # another topology is warmed for itself
    assert SampledRangeSpout.samples == 2


def test_a_local_session_runs_the_parallel_collector(spark: Any) -> None:
    """``create_spark_session`` on a local master starts the JVM with
    ``LOCAL_JAVA_OPTIONS``: the parallel collector's beans are the JVM's, not G1's."""
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    names = {bean.getName() for bean in beans.getGarbageCollectorMXBeans()}
    assert names == {"PS Scavenge", "PS MarkSweep"}


class LosesSessionAtStart(RangeSpout):
    """At txid ``lost_txid``'s first start, once the sink holds the txid before it (no
    other attempt, commit or job group under way), the Connect client is closed as
    PySpark closes it when a reply comes from another server session (a restarted
    server: ``INVALID_HANDLE.SESSION_CHANGED``); the spout then asks the server while
    deciding the batch, as a spout whose metadata comes from a table does."""

    def __init__(self, lost_txid: int, committed: Callable[[], int]) -> None:
        super().__init__()
        self.lost_txid = lost_txid
        self.committed = committed
        self.lost = False
        self.met_closed = 0

    def initialize_transaction(self, txid: int, prev_meta: Range | None) -> Range:
        from pyspark.errors.exceptions.connect import SparkConnectException

        if txid == self.lost_txid and not self.lost:
            deadline = time.monotonic() + 60
            while self.committed() < self.lost_txid - 1:
                assert time.monotonic() < deadline, "the txid before not committed in 60 s"
                time.sleep(0.05)
            self.lost = True
            self.spark.client._closed = True
        try:
            self.spark.range(1).count()
        except SparkConnectException as e:
            assert "NO_ACTIVE_SESSION" in str(e), e
            self.met_closed += 1
            raise
        return super().initialize_transaction(txid, prev_meta)


@pytest.mark.connect
@pytest.mark.connect_only
def test_on_spark_connect_a_session_lost_at_an_attempts_start_is_reopened_by_its_retry(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    """An attempt that fails at its start is not cancelled, and a cancel was where the
    session got reopened: every retry of the txid met the closed client until the txid
    was poisoned (a server restarted mid-run, in CI). Its retry reopens it now."""
    from transactional.spark.connect import reopen_if_lost

    spout = LosesSessionAtStart(2, lambda: redis_txid(redis_url, "sink", "reopened"))
    topology = build(spark, redis_url, spout)
    config = RunnerConfig(topology_id="reopened", max_pending=1, backoff_initial_s=0.1)
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        stats = TransactionalRunner(topology, store, spark, config).run(until_drained=True)
    finally:
        reopen_if_lost(spark)  # the suite's session, should the run have left it closed
    assert spout.met_closed == 1  # the fault fired: the spout's call met the closed client
    assert buckets(redis_url) == expected_counts()
    assert stats.committed_txids == TOTAL // BATCH and stats.failures == 1
