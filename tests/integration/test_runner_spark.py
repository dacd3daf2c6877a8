"""The runner on real Spark, a real SQLite store and a real Redis sink: job groups,
timeouts that cancel Spark jobs, and the ``transactional`` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from coordinators import SQLiteStateStore
from tests.integration.topologies import BATCH, TOTAL, RangeSpout, build, expected_counts
from tests.witness import spark_settled
from transactional import RunnerConfig, TransactionalRunner

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
    config = RunnerConfig(topology_id="buckets", attempt_timeout_s=5)
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


def test_the_transactional_command_runs_a_factory_and_reports_status(
    redis_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, "BUCKETS_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
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
            "--master",
            "local[2]",
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
        config = RunnerConfig(topology_id=topology_id, max_pending=2)
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
