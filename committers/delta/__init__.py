"""The Delta Lake committer: counters and dead letters in Delta tables, the txid in each
table's own idempotent-write marker; ``DeltaSnapshot``, which reads what a table held at
a version; ``delta_spark_conf``, the Spark settings a session needs for Delta; and
``table_root``, where tables under a path or URL live (or why they cannot).

The modules behind it are private: ``_committer`` (the committer), ``_target`` (what its
writers and reader share, and the writers' interface), ``_tables`` (the tables and their
settings), ``_location`` (local directories and S3 buckets), ``_arrow`` and ``_rs`` (small commits on the driver, through
delta-rs), ``_sql`` and ``_spark`` (large commits as a Spark MERGE), ``_parquet`` (the
table's files), ``_read`` and ``_snapshot`` (the reading side) and ``_rewind``."""

from committers.delta._committer import DeltaCommitter
from committers.delta._location import table_root
from committers.delta._snapshot import DeltaSnapshot
from committers.delta._tables import delta_spark_conf

__all__ = ["DeltaCommitter", "DeltaSnapshot", "delta_spark_conf", "table_root"]
