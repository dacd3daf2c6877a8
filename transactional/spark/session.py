"""Building the one SparkSession a runner uses, quiet and small by default."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from transactional.errors import ConfigurationError
from transactional.spark.connect import client_only, is_connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "create_spark_session",
    "executor_python",
    "is_connect",
    "is_local",
    "merged",
    "session_settings",
    "stop_spark_session",
]

#: The fair scheduler's pools: ``transactional.spark.engine.FIRST_POOL`` for the oldest
#: attempt being processed and every commit, Spark's default pool for the rest.
SCHEDULER_POOLS = Path(__file__).with_name("scheduler.xml")

#: Defaults on every master: no console progress bars (the runner shows its own), Arrow
#: between the JVM and Python, adaptive execution, and the fair scheduler with
#: ``SCHEDULER_POOLS``, so that the runner can put the oldest txid's jobs first. The
#: driver's pool that runs adaptive execution's result stages is capped at 16 threads:
#: its core size is its maximum (1024 by default), so it starts a thread for every
#: result stage until it has that many, each kept a minute idle; a run of small txids
#: held about a thousand such threads in the driver's JVM (``tests/soak.py``).
DEFAULTS: Mapping[str, str] = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.resultQueryStage.maxThreadThreshold": "16",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.scheduler.mode": "FAIR",
    "spark.scheduler.allocation.file": SCHEDULER_POOLS.as_uri(),
}

#: Defaults for a local runner only (``local``, ``local[N]``, ``local[*]``): no UI, few
#: shuffle partitions (batches are small; 200 partitions would be 200 tiny tasks per
#: aggregation), 2 GiB for the driver, which is also the executor. On a cluster these
#: come from the user's configuration (``--conf``, ``spark-defaults.conf``).
LOCAL_DEFAULTS: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.driver.memory": "2g",
}


def is_local(master: str) -> bool:
    """Whether ``master`` runs everything in this process's JVM (``local``, ``local[4]``,
    ``local[*]``, ``local[2,3]``)."""
    return master == "local" or master.startswith("local[")


LOG4J2 = Path(__file__).with_name("log4j2.properties")

#: The JVM's options on a local master, where the driver is also the executor: Spark's
#: logs as ``LOG4J2`` says, and the parallel (throughput) collector instead of G1. A
#: batch's work allocates rows at a high rate and keeps few for long; G1's concurrent
#: marking and remembered sets cost 15 to 20% of the CPU of the tweet benchmark on two
#: cores, for the bare Spark job and Structured Streaming as for the framework, and its
#: short pauses buy nothing a batch needs (benchmarks/analysis.md, tenth round). On a
#: cluster the executors' JVM options are the user's (``spark.executor.extraJavaOptions``).
LOCAL_JAVA_OPTIONS = "-XX:+UseParallelGC"

#: Settings that are comma-separated lists, joined (not replaced) by ``merged``.
LIST_SETTINGS = frozenset({"spark.jars", "spark.jars.packages", "spark.sql.extensions"})


def merged(*confs: Mapping[str, str]) -> dict[str, str]:
    """Several components' Spark settings as one: later ones win, except the list
    settings (``spark.jars``, ...), whose entries are joined, each once."""
    out: dict[str, str] = {}
    for conf in confs:
        for key, value in conf.items():
            if key in LIST_SETTINGS and out.get(key):
                entries = [*out[key].split(","), *value.split(",")]
                value = ",".join(dict.fromkeys(e for e in entries if e))
            out[key] = value
    return out


def session_settings(master: str, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings a session on ``master`` gets: ``DEFAULTS``, ``LOCAL_DEFAULTS`` on a
    local master only, Spark's logs at WARN from the JVM's first line (and on a local
    master ``LOCAL_JAVA_OPTIONS``), then ``conf``: a ``spark.driver.extraJavaOptions``
    given there replaces all of ours (two collectors named would stop the JVM)."""
    local = is_local(master)
    settings = {**DEFAULTS, **(LOCAL_DEFAULTS if local else {})}
    java = f"-Dlog4j2.configurationFile={LOG4J2.as_uri()}"
    settings["spark.driver.extraJavaOptions"] = f"{java} {LOCAL_JAVA_OPTIONS}" if local else java
    settings.update(conf or {})
    return settings


def executor_python(master: str, settings: Mapping[str, str]) -> str | None:
    """The Python the executors must run, to be put in ``PYSPARK_PYTHON`` before the
    session starts (None: leave it as it is). A driver that spark-submit did not start
    (``transactional run``, the demo, a notebook) takes its executors' Python from that
    variable only: PySpark ignores ``spark.pyspark.python`` given to the builder, and the
    workers would run their own ``python3``. So the setting, when given, wins; on a local
    master the default is this interpreter (the one with pyarrow and the project)."""
    given = settings.get("spark.pyspark.python")
    if given:
        return given
    if is_local(master):
        return os.environ.get("PYSPARK_PYTHON") or sys.executable
    return None


def create_spark_session(
    master: str = "local[*]",
    app_name: str = "transactional",
    conf: Mapping[str, str] | None = None,
    *,
    remote: str | None = None,
) -> SparkSession:
    """Create (or reuse) the session. ``conf`` wins over the defaults; a committer that
    needs Spark extensions (Delta) supplies them through it. On a cluster master only
    ``DEFAULTS`` apply: the executors' Python (``spark.pyspark.python`` or
    ``PYSPARK_PYTHON``), memory and partitions are the user's to set. The driver's JVM,
    when this starts it, writes its stderr through ``STDERR_FILTER`` (see there).

    ``remote`` (``sc://host:port``): a Spark Connect session on that server instead, no
    JVM here (``master`` is then the server's; see ``connect_session``)."""
    from pyspark.sql import SparkSession

    if remote is not None:
        from transactional.spark.connect import connect_session

        return connect_session(remote, app_name, {**DEFAULTS, **(conf or {})})
    if client_only():
        raise ConfigurationError(
            f"create_spark_session: master {master!r} needs PySpark with its JVM (pip install "
            "'transactional-spark[spark]'); this install has only the Spark Connect client "
            "(pyspark-client): give the server's address instead (remote='sc://host:port', "
            "--remote on the command line)"
        )
    settings = session_settings(master, conf)
    python = executor_python(master, settings)
    if python is not None:
        os.environ["PYSPARK_PYTHON"] = python
    # What ``builder.master(...).appName(...).config(...)`` would hold, in that order.
    options = {"spark.master": master, "spark.app.name": app_name, **settings}
    _start_driver_jvm(options)
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


#: The line the JVM prints first, on every run: left out of this process's stderr.
INCUBATOR_WARNING = "WARNING: Using incubator modules: jdk.incubator.vector"

#: Between the driver's JVM and this process's stderr: a process that passes every byte
#: through as it comes, except ``INCUBATOR_WARNING`` the first time it is a whole line.
#:
#: Why the line is there: Spark's launcher puts ``--add-modules=jdk.incubator.vector`` on
#: the command line of every JVM it starts (``JavaModuleOptions`` in spark-launcher, which
#: ``SparkSubmitCommandBuilder`` adds to the driver's options in client mode, whatever the
#: master; ``SparkContext`` adds the same options to the executors' ``extraJavaOptions``),
#: and the JVM's module system prints the warning for every incubator module it resolves
#: (``jdk.internal.module.ModuleBootstrap``, straight to ``System.err``). Neither has a
#: switch: no Spark setting, launcher option or environment variable leaves the module
#: out (``spark.driver.extraJavaOptions``, ``SPARK_SUBMIT_OPTS`` only add options, and a
#: module once added cannot be taken away), and no JVM flag silences that warning.
#:
#: Why the module stays: in Spark 4.2 only netlib's ``VectorBLAS`` uses it (the
#: ``blas-3.2.0.jar`` that PySpark ships; no other class in its jars, nor Delta's or
#: Kafka's, refers to ``jdk.incubator.vector``). That is the pure-Java BLAS MLlib takes
#: when no native BLAS is installed (``spark.ml`` and ``spark.mllib`` linear algebra,
#: breeze, GraphX's SVD++). The runner never calls it, but a user's bolt may use
#: ``pyspark.ml``; without the module its BLAS would fall back to the slower scalar Java
#: one. So the JVM keeps the module and the line is taken out of its stderr instead.
#:
#: Why a process and not a thread of this one: it carries the JVM's stderr for as long as
#: anything writes to it (the JVM and the Python workers it forks inherit it), so what
#: the JVM says after this process has exited (its shutdown, once the driver is gone)
#: still shows; and it does not take turns with the driver for this process's GIL. It
#: imports nothing of the project (``transactional.spark.stderr_filter``): ~10 MB, started
#: while the JVM starts. Removing the line, not hiding Spark's other output: every other
#: byte passes unchanged, at once (only a line that so far reads as the start of that
#: warning waits for its next bytes).
STDERR_FILTER = Path(__file__).with_name("stderr_filter.py")

#: Filters kept referenced while they run (a ``Popen`` collected while its process
#: still runs warns).
_filters: list[subprocess.Popen[bytes]] = []


def stop_spark_session(spark: SparkSession) -> None:
    """``spark.stop()`` for a program about to end: on a classic session the SparkContext
    stops as ``stop()`` stops it (the JVM side: 0.05 s), without then waiting up to a
    second for PySpark's accumulator server, whose thread (a daemon, which ends with the
    process) looks for a shutdown once a second. Measured: ``stop()`` 0.99 s, this
    0.05 s, on every run of a command that starts its own session."""
    if not is_connect(spark):
        context = spark.sparkContext
        server = getattr(context, "_accumulatorServer", None)
        if server is not None:
            server.server_shutdown = True  # its thread ends at its next look
            context._accumulatorServer = None  # type: ignore[assignment]
    spark.stop()


def _start_driver_jvm(options: Mapping[str, str]) -> None:
    """Start the driver's JVM as ``SparkSession.builder.getOrCreate`` would (PySpark's
    ``launch_gateway``, given the builder's options as ``--conf``, which is where the
    driver's memory and Java options take effect), but with its stderr through
    ``STDERR_FILTER``, and make the session's ``SparkContext`` on it. On a local master
    and on a cluster alike (``spark://...``): the driver's JVM starts on this machine. The
    executors' copies of the line go to their own stderr (the workers' ``work``
    directories), not to this run's output.

    Nothing is started where the builder would start nothing either: a JVM already
    there (an earlier session of this process; a driver that ``spark-submit`` started,
    ``PYSPARK_GATEWAY_PORT``), or Spark Connect. Nor when the filter itself cannot start
    (no stderr, no interpreter to run it): the builder then starts the JVM as before."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
            return
        if _connect_mode(options):
            return
        if not sys.executable:
            return
        try:
            # Its stdout is this process's fd 2, the stderr the JVM would have inherited.
            stderr_filter = subprocess.Popen(
                [sys.executable, "-I", "-S", str(STDERR_FILTER), INCUBATOR_WARNING],
                stdin=subprocess.PIPE,
                stdout=2,
            )
        except OSError:
            return
        _filters.append(stderr_filter)
        assert stderr_filter.stdin is not None
        conf = SparkConf()
        for key, value in options.items():
            conf.set(key, value)
        try:
            # The JVM gets its own copy of the pipe and this process keeps none: the
            # filter ends when the JVM and its children have all closed theirs.
            gateway = launch_gateway(conf, popen_kwargs={"stderr": stderr_filter.stdin})
        except Exception:
            stderr_filter.stdin.close()
            # The JVM exited: what it said before it did shows before the traceback.
            with contextlib.suppress(subprocess.TimeoutExpired):
                stderr_filter.wait(timeout=5)
            raise
        finally:
            stderr_filter.stdin.close()
        SparkContext(conf=conf, gateway=gateway)


def _connect_mode(options: Mapping[str, str]) -> bool:
    """Whether the builder would make a Spark Connect session (no local JVM of ours)."""
    from pyspark.util import default_api_mode, is_remote_only

    mode = options.get("spark.api.mode", os.environ.get("SPARK_API_MODE", "")).lower()
    return (
        is_remote_only()
        or "spark.remote" in options
        or "SPARK_REMOTE" in os.environ
        or "SPARK_CONNECT_MODE_ENABLED" in os.environ
        or (mode if mode in ("classic", "connect") else default_api_mode()) == "connect"
    )
