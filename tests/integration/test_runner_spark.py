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
    tracker = spark.sparkContext.statusTracker()
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
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


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
