"""The SparkSession a topology runs on: ``create_spark_session`` (a classic session on a
master, or a Spark Connect one with ``remote``), ``merged`` to combine the Spark
settings components ask for, and ``stop_spark_session``. They are built in
``transactional.spark.session``, with the rest of the Spark plumbing."""

from transactional.spark.session import (
    create_spark_session,
    executor_python,
    is_connect,
    is_local,
    merged,
    session_settings,
    stop_spark_session,
)

__all__ = [
    "create_spark_session",
    "executor_python",
    "is_connect",
    "is_local",
    "merged",
    "session_settings",
    "stop_spark_session",
]
