"""The Java options of the Spark drivers the tests start, for JVMs that start often, and
the Python their executors start.

Most of what a crash test spends is Spark starting, again and again: a demo process per
kill. Two options take about a third off a start (a session and its first jobs, 16 s to
10 s on 2 cores) and change nothing a test observes:

- ``-XX:TieredStopAtLevel=1``: the quick JIT compiler only, for the demo's processes;
- for them and the suite's own session, a class-data-sharing archive of the classes a
  driver loads (``-XX:SharedArchiveFile``, JDK 13+ dynamic archives): mapped from disk
  instead of parsed and verified at every start. It is made once per machine
  (``python -m tests.jvm``, about a minute) by a
  driver that runs what the tests run (Delta, Kafka's jars, Arrow, a Python UDF) with
  ``-XX:ArchiveClassesAtExit``, and kept under a name that changes with the JVM, PySpark
  and the jars, so an archive never meets a class path it was not made for. Were it to,
  the JVM runs without it (``-Xshare:auto``, the default), and its warning is off.

And one for the executors' Python workers (``worker_python``): PySpark puts its own
copies of ``pyspark`` and ``py4j`` (``pyspark.zip``, the py4j zip, the spark-core jar) first
on every worker's ``PYTHONPATH``. Imported from a zip, whose sources are compiled at every
start (a zip holds no bytecode cache), ``pyspark.worker`` takes about 0.7 s against 0.1 s
from the installed package, and every task pays about 0.1 s more re-reading the zips'
directories (``importlib.invalidate_caches``, which PySpark calls per task). The tests'
executors run a wrapper of this interpreter that drops those entries, so the workers
import the same PySpark from the installed package: about 0.8 s off each demo run.

Tests only: the benchmarks and a user's runs keep the JVM's and PySpark's defaults.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transactional.testing.servers import SparkConnectServer

ROOT = Path(__file__).resolve().parent.parent
QUICK_JIT = "-XX:TieredStopAtLevel=1"
#: The archive's own messages (made with classes it skips; not usable) left out of the
#: driver's output, which tests read.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "transactional-tests"


@functools.cache
def driver_opts(*, quick: bool) -> str:
    """``SPARK_SUBMIT_OPTS`` for a driver started by the tests: the archive when there is
    one or it can be made (made here the first time, under a lock: pytest-xdist's
    workers ask at once), and with ``quick`` the quick JIT (for the demo's processes,
    not for the suite's own session, which lives as long as the suite)."""
    archive = _archive()
    opts = [QUICK_JIT] if quick else []
    if archive is not None:
        opts += [f"-XX:SharedArchiveFile={archive}", QUIET]
    return " ".join(opts)


def short_lived(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a Spark driver the tests start that lives seconds (a demo or a
    ``transactional`` command): the quick JIT and the archive in place of the options
    of the suite's own session, which a child inherits; ``SPARK_SUBMIT_OPTS`` set from
    outside the suite is left as it is. Its executors' Python is ``worker_python``
    unless another one is set."""
    out = dict(env)
    if out.get("SPARK_SUBMIT_OPTS", "") in ("", driver_opts(quick=False)):
        out["SPARK_SUBMIT_OPTS"] = driver_opts(quick=True)
    out["PYSPARK_PYTHON"] = executors_python(out)
    return out


def short_lived_server(conf: Mapping[str, str] | None = None) -> SparkConnectServer:
    """A Spark Connect server (not started yet) for a test that starts it, kills it and
    starts it again within a minute or two: its JVM started as a demo's driver is (the
    quick JIT and the archive) and its Python workers ``worker_python``, as
    ``short_lived`` sets them. (The suite's own server, which lives as long as the
    suite, keeps the full JIT.) Its ``conf`` as ``SparkConnectServer``'s."""
    from transactional.testing.servers import SparkConnectServer

    return SparkConnectServer(
        conf=dict(conf or {}),
        python_path=str(ROOT),
        python=worker_python(),
        java_options=driver_opts(quick=True),
    )


def executors_python(env: Mapping[str, str]) -> str:
    """The executors' Python for a driver started with ``env``: ``worker_python``, unless
    ``env`` sets another than this interpreter."""
    given = env.get("PYSPARK_PYTHON", sys.executable)
    return worker_python() if given == sys.executable else given


@functools.cache
def worker_python() -> str:
    """The Python the tests' executors run: this interpreter, started with PySpark's
    zips and jar dropped from ``PYTHONPATH`` (they hold the installed ``pyspark`` and
    ``py4j`` again; the module docstring says what they cost). A script made once per
    interpreter, beside the class archive."""
    script = (
        "#!/bin/sh\n"
        "# PySpark's executors' Python for the tests (tests/jvm.py): PYTHONPATH without\n"
        "# PySpark's own zips and jar, so the installed pyspark and py4j are imported.\n"
        'PYTHONPATH=$(printf %s "$PYTHONPATH" | tr : "\\n" | '
        "grep -v -e '/pyspark/python/lib/[^/]*\\.zip$' -e '/pyspark/jars/[^/]*\\.jar$' | "
        "paste -s -d : -)\n"
        f'export PYTHONPATH\nexec "{sys.executable}" "$@"\n'
    )
    name = hashlib.sha256(script.encode()).hexdigest()[:16]
    path = CACHE / f"python-{name}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(script)
        partial.chmod(0o755)
        partial.replace(path)
    return str(path)


def made() -> bool:
    """Whether nothing is left to make: the archive is there already, or none is made
    here (no Java, or no driver: PySpark's Connect client alone)."""
    path = _archive_path()
    return path is None or path.exists()


def driver_conf() -> dict[str, str]:
    """The settings of the tests' drivers that decide their class path: Delta's,
    Kafka's and the s3a connector's jars (resolved into the project's cache; each test's
    bucket is set up by the ``s3_bucket`` fixture), on loopback."""
    from committers.delta import delta_spark_conf
    from transactional.sources.kafka import kafka_spark_conf
    from transactional.spark.session import merged
    from transactional.spark.storage import s3_spark_conf

    loopback = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    return merged(delta_spark_conf(), kafka_spark_conf(), s3_spark_conf({}), loopback)


def _archive_path() -> Path | None:
    """Where the archive for this JVM, PySpark and jars is kept (None: no Java, or no
    driver here: PySpark's Connect client alone)."""
    import pyspark

    from transactional.spark.connect import client_only

    java = shutil.which("java")
    if java is None or client_only():
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    key = hashlib.sha256()
    for part in (
        str(jars),  # the class path the archive is checked against at every start
        os.path.realpath(java),
        str(os.stat(os.path.realpath(java)).st_mtime_ns),
        pyspark.__version__,
        *sorted(p.name for p in jars.glob("*.jar")),
        driver_conf()["spark.jars"],
    ):
        key.update(part.encode() + b"\0")
    return CACHE / f"spark-{key.hexdigest()[:16]}.jsa"


def _archive() -> Path | None:
    """The archive, made if missing; None when it cannot be made (the JVM then starts
    without one, as it would anyway)."""
    path = _archive_path()
    if path is None:
        return None
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return path
        partial = path.with_suffix(f".{os.getpid()}.partial")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"}
        env["SPARK_SUBMIT_OPTS"] = f"{QUICK_JIT} -XX:ArchiveClassesAtExit={partial} {QUIET}"
        env.pop("PYSPARK_PYTHON", None)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "tests.jvm"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=600,
            )
        except subprocess.TimeoutExpired:
            done = None
        if done is None or done.returncode != 0 or not partial.exists():
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
            return None
        partial.replace(path)
        return path


def _workload() -> None:
    """What the tests' drivers do, once, so that the archive holds the classes they load:
    a session as theirs, Delta written by delta-spark (append, MERGE) and read back,
    Arrow collection, a grouped aggregate, a Python UDF. Then the JVM is made to exit
    (its stdin closed) and waited for: the archive is written as it exits."""
    import tempfile

    from delta.tables import DeltaTable
    from pyspark import SparkContext
    from pyspark.sql import functions as F

    from transactional.spark.session import create_spark_session

    spark = create_spark_session("local[2]", "tests-jvm-archive", driver_conf())
    with tempfile.TemporaryDirectory() as tmp:
        table = f"{tmp}/t"
        rows = spark.range(2000).select(
            (F.col("id") % 37).cast("string").alias("key"), F.lit(1).cast("long").alias("n")
        )
        counts = rows.groupBy("key").agg(F.sum("n").alias("n"))
        counts.write.format("delta").save(table)
        target = DeltaTable.forPath(spark, table)
        (
            target.alias("t")
            .merge(counts.alias("s"), "t.key = s.key")
            .whenMatchedUpdate(set={"n": "t.n + s.n"})
            .whenNotMatchedInsertAll()
            .execute()
        )
        spark.read.format("delta").load(table).toArrow()
        upper = F.udf(lambda s: s.upper(), "string")
        rows.select(upper("key")).distinct().collect()
        spark.sql("SELECT 1").collect()
    gateway = SparkContext._gateway
    spark.stop()
    proc = getattr(gateway, "proc", None)
    if proc is not None and proc.stdin is not None:
        proc.stdin.close()
        proc.wait(timeout=300)


if __name__ == "__main__":
    _workload()
