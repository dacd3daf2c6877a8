"""Spark's own logs stay at WARN or above and say nothing at ERROR about what the runner
does on purpose. Cancelling an attempt (Ctrl-C, a timeout, a superseded txid) while the
engine materialises its batch ends Spark's ``noop`` write, which Spark logs at ERROR
("Data source write support NoopBatchWrite is aborting"); the cancel is the runner's
own, and a real failure reaches the runner as the job's exception. A task killed in the
middle of that write adds three lines at ERROR ("Aborting task", "Aborting commit for
partition ...", "Aborted commit ..."), dropped too; Spark's WARN for the lost task, which
says why a failed task failed, stays."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.e2e.test_cli import ROOT

pytestmark = pytest.mark.e2e

# In a process of its own: Spark's JVM writes its logs to the process's stderr.
CHILD = textwrap.dedent(
    """
    import threading, time
    from pyspark.sql import functions as F
    from transactional.engine import SparkEngine
    from transactional.session import create_spark_session

    spark = create_spark_session("local[1]")
    engine = SparkEngine(spark)
    # Long enough to be running when cancelled: a hash of a billion rows.
    frame = spark.range(0, 1_000_000_000, numPartitions=1).withColumn(
        "x", F.sha2(F.col("id").cast("string"), 256)
    )
    outcome = []

    def materialise():
        with engine.job_group("attempt"):
            try:
                engine.materialise([frame], digest=True)
                outcome.append("finished")
            except Exception as e:
                outcome.append("cancelled" if "cancelled" in str(e) else repr(e))

    worker = threading.Thread(target=materialise)
    worker.start()
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 120
    while not tracker.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    engine.cancel("attempt")
    worker.join()
    print(outcome[0], flush=True)
    spark.stop()
    """
)


def test_a_cancelled_materialising_job_logs_nothing_at_error() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["cancelled"], done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if "level=ERROR" in line]
    assert errors == [], done.stderr[-3000:]


# Logged through the session's own log4j, as Spark logs them: what a task killed
# mid-write says (dropped), and lines like them that are not that (kept).
LOGGED = textwrap.dedent(
    """
    from transactional.session import create_spark_session

    spark = create_spark_session("local[1]")
    manager = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager
    utils = manager.getLogger("org.apache.spark.util.Utils")
    task = manager.getLogger("org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask")
    utils.error("Aborting task")
    task.error("Aborting commit for partition 0 (task 4, attempt 0, stage 4.0)")
    task.error("Aborted commit for partition 12 (task 40, attempt 1, stage 7.1)")
    utils.error("Aborting task because the disk is full")
    task.error("Commit denied for partition 0 (task 4, attempt 0, stage 4.0)")
    spark.stop()
    """
)


def test_the_lines_of_a_task_killed_mid_write_are_dropped_and_no_other() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOGGED], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    errors = [line.split(" ", 1)[1] for line in done.stderr.splitlines() if "level=ERROR" in line]
    assert errors == [
        "level=ERROR logger=Utils Aborting task because the disk is full",
        "level=ERROR logger=DataWritingSparkTask Commit denied for partition 0 (task 4, "
        "attempt 0, stage 4.0)",
    ], done.stderr[-3000:]
