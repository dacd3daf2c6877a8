"""Building the one SparkSession a runner uses, quiet and small by default."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Defaults for a local runner: no UI, no console progress bars, few shuffle partitions
#: (batches are small; 200 partitions would be 200 tiny tasks per aggregation).
LOCAL_DEFAULTS: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "2g",
}


LOG4J2 = Path(__file__).with_name("log4j2.properties")

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


def create_spark_session(
    master: str = "local[*]",
    app_name: str = "transactional",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Create (or reuse) the session. ``conf`` wins over the defaults; a committer that
    needs Spark extensions (Delta) supplies them through it."""
    from pyspark.sql import SparkSession

    # Python workers must run this interpreter: it is the one with pyarrow and the
    # project installed (a bare ``python3`` on PATH may have neither).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = dict(LOCAL_DEFAULTS)
    # Spark's logs at WARN from the JVM's first line, not only after setLogLevel.
    settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={LOG4J2.as_uri()}"
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
