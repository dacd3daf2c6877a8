"""Building the one SparkSession a runner uses, quiet and small by default."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The fair scheduler's pools: ``transactional.engine.FIRST_POOL`` for the oldest
#: attempt being processed and every commit, Spark's default pool for the rest.
SCHEDULER_POOLS = Path(__file__).with_name("scheduler.xml")

#: Defaults on every master: no console progress bars (the runner shows its own), Arrow
#: between the JVM and Python, adaptive execution, and the fair scheduler with
#: ``SCHEDULER_POOLS``, so that the runner can put the oldest txid's jobs first.
DEFAULTS: Mapping[str, str] = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "true",
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
) -> SparkSession:
    """Create (or reuse) the session. ``conf`` wins over the defaults; a committer that
    needs Spark extensions (Delta) supplies them through it. On a cluster master only
    ``DEFAULTS`` apply: the executors' Python (``spark.pyspark.python`` or
    ``PYSPARK_PYTHON``), memory and partitions are the user's to set."""
    from pyspark.sql import SparkSession

    settings = session_settings(master, conf)
    python = executor_python(master, settings)
    if python is not None:
        os.environ["PYSPARK_PYTHON"] = python
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
