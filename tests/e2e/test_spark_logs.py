"""Spark's own logs stay at WARN or above and say nothing at ERROR about what the runner
does on purpose. Cancelling an attempt (Ctrl-C, a timeout, a superseded txid) while the
engine materialises its batch ends Spark's ``noop`` write, which Spark logs at ERROR
("Data source write support NoopBatchWrite is aborting"); the cancel is the runner's
own, and a real failure reaches the runner as the job's exception. A task killed in the
middle of that write adds three lines at ERROR ("Aborting task", "Aborting commit for
partition ...", "Aborted commit ..."), dropped too; Spark's WARN for the lost task, which
says why a failed task failed, stays.

The JVM's first line, "WARNING: Using incubator modules: jdk.incubator.vector" (Spark's
launcher adds that module to every JVM it starts), is left out of a session's stderr,
on a local master and on a standalone cluster, and every other line of the JVM's stderr
still shows, as it is written (``transactional.spark.session.STDERR_FILTER``)."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import IO

import pytest

from tests.e2e.test_cli import ROOT
from transactional.spark.session import INCUBATOR_WARNING
from transactional.testing.cluster_servers import SparkMaster, SparkWorker

pytestmark = pytest.mark.e2e

# In a process of its own: Spark's JVM writes its logs to the process's stderr.
CHILD = textwrap.dedent(
    """
    import threading, time
    from pyspark.sql import functions as F
    from transactional.spark.engine import SparkEngine
    from transactional.spark.session import create_spark_session

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

    def running_tasks():
        stages = (tracker.getStageInfo(s) for s in tracker.getActiveStageIds())
        return sum(s.numActiveTasks for s in stages if s is not None)

    # Cancelled once a task runs: the write inside a task is what logs at ERROR.
    while not running_tasks() and time.monotonic() < deadline:
        time.sleep(0.05)
    engine.cancel("attempt")
    worker.join()
    # One core: a job after the cancel runs once the killed task gave its slot back,
    # which it does after its completion listeners ran. Stopped before that, Spark's
    # listener logs a broadcast block the stop removed, at ERROR.
    spark.range(1).count()
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
    from transactional.spark.session import create_spark_session

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


# A trivial job on a session made by create_spark_session ("ours") or by a bare builder,
# as Spark has it ("plain"); then a WARN through the session's log4j and a line straight
# to the JVM's System.err. The child waits on its stdin before it stops, so the test sees
# whether those lines come through while the JVM still runs.
TRIVIAL = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    from transactional.spark.session import create_spark_session

    master, how, conf = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if how == "ours":
        spark = create_spark_session(master, conf=conf)
    else:
        builder = SparkSession.builder.master(master)
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
    print(spark.range(100, numPartitions=2).selectExpr("sum(id)").first()[0], flush=True)
    jvm = spark.sparkContext._jvm
    jvm.org.apache.logging.log4j.LogManager.getLogger("org.apache.spark.SparkContext").warn(
        "a warning that stays"
    )
    jvm.System.err.println("a line of the JVM's own")
    print("logged", flush=True)
    sys.stdin.readline()
    spark.stop()
    """
)
JVM_LINES = ("a warning that stays", "a line of the JVM's own")


def trivial_job(
    master: str, how: str, conf: dict[str, str] | None = None, timeout: float = 240
) -> tuple[list[str], list[str]]:
    """The child's stdout and stderr lines. Fails unless both ``JVM_LINES`` reach its
    stderr while it still runs (it waits for the test before it stops)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", TRIVIAL, master, how, json.dumps(conf or {})],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[tuple[str, str | None]] = queue.Queue()

    def pump(name: str, stream: IO[str]) -> None:
        for line in stream:
            lines.put((name, line.rstrip("\n")))
        lines.put((name, None))

    assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
    for name, stream in (("out", proc.stdout), ("err", proc.stderr)):
        threading.Thread(target=pump, args=(name, stream), daemon=True).start()
    seen: dict[str, list[str]] = {"out": [], "err": []}
    ended: set[str] = set()
    deadline = time.monotonic() + timeout

    def until(done: Callable[[], bool], what: str) -> None:
        while not done():
            try:
                name, line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(
                    f"no {what} within {timeout} s; stderr so far:\n" + "\n".join(seen["err"][-40:])
                )
            if line is None:
                ended.add(name)
            else:
                seen[name].append(line)
            if len(ended) == 2 and not done():
                pytest.fail(
                    f"the child ended before {what}; stderr:\n" + "\n".join(seen["err"][-40:])
                )

    try:
        until(
            lambda: (
                "logged" in seen["out"]
                and all(any(m in line for line in seen["err"]) for m in JVM_LINES)
            ),
            "JVM lines while the child runs",
        )
        assert proc.poll() is None  # still waiting for us: the lines came as written
        proc.stdin.write("\n")
        proc.stdin.close()
        until(lambda: len(ended) == 2, "end of the child's output")
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, seen["err"][-40:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return seen["out"], seen["err"]


def assert_filtered(out: list[str], err: list[str]) -> None:
    assert out == ["4950", "logged"], err
    assert [line for line in err if "Using incubator modules" in line] == [], err
    # The other lines, as the JVM wrote them: the log4j line in the session's layout.
    assert "a line of the JVM's own" in err, err
    assert [line.split(" ", 1)[1] for line in err if "a warning that stays" in line] == [
        "level=WARN logger=SparkContext a warning that stays"
    ], err


@pytest.mark.slow  # make test-slow: two Spark JVMs, ours and a plain builder's
def test_the_incubator_warning_is_left_out_of_a_sessions_stderr_and_nothing_else() -> None:
    out, err = trivial_job("local[1]", "ours")
    assert_filtered(out, err)
    # Without create_spark_session, Spark's JVM says it first thing: what is left out.
    out, err = trivial_job("local[1]", "plain")
    assert out == ["4950", "logged"], err
    assert err[0] == INCUBATOR_WARNING == "WARNING: Using incubator modules: jdk.incubator.vector"
    assert [line for line in err if "Using incubator modules" in line] == [INCUBATOR_WARNING]


@pytest.mark.cluster
def test_on_a_standalone_cluster_the_driver_leaves_the_incubator_warning_out() -> None:
    """The driver's JVM starts on this machine whatever the master: the same filter."""
    loopback = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m",
    }
    master = SparkMaster()
    master.start()
    worker = SparkWorker(master, cores=1, memory="1g")
    try:
        worker.start()
        assert_filtered(*trivial_job(master.url, "ours", loopback))
        out, err = trivial_job(master.url, "plain", loopback)
        assert out == ["4950", "logged"], err
        assert err[0] == INCUBATOR_WARNING
    finally:
        worker.close()
        master.close()
