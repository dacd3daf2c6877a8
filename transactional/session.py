"""Building the one SparkSession a runner uses, quiet and small by default."""

from __future__ import annotations

from collections.abc import Mapping
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


def create_spark_session(
    master: str = "local[*]",
    app_name: str = "transactional",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Create (or reuse) the session. ``conf`` wins over the defaults; a committer that
    needs Spark extensions (Delta) supplies them through it."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    merged = dict(LOCAL_DEFAULTS)
    merged.update(conf or {})
    for key, value in merged.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
