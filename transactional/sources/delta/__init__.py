"""A Delta table as a source: txids follow the table's versions, so a Delta table can
feed a topology exactly once. One stream of batches (a transactional spout): each txid
takes the versions after the last txid's, up to ``batch_size`` records (at least one
version), decided on the driver from the table's log and read by delta-spark.

- Appends (the default): a txid's records are the rows its versions added, each
  file read in the version that added it (so a later compaction cannot hide it). A
  version that changes or deletes rows (``DELETE``, ``UPDATE``, ``MERGE``, an
  overwrite: a ``remove`` with ``dataChange``) cannot be read as appends: the run
  stops with ``SourceSchemaError`` naming the version and the operation, and says to
  use the change data feed. Versions that move data without changing it (``OPTIMIZE``:
  ``dataChange`` false) add nothing.
- ``change_data_feed=True``: the table's change data feed (``delta.enableChangeDataFeed``
  must be on), with Delta's ``_change_type`` (``insert``, ``update_preimage``,
  ``update_postimage``, ``delete``), ``_commit_version`` and ``_commit_timestamp``.
- A version that changes the table's schema stops the run with ``SourceSchemaError``:
  the records after it would not have the schema of those before.
- A version whose log entry is gone (log retention, ``VACUUM`` of the files a stored
  txid reads) cannot be replayed: ``SourceDataLostError``.

Start positions (``start=``): ``"earliest"`` (version 0, the default), ``"latest"``
(versions committed after the start), a version number, or a ``datetime`` (the first
version committed at or after it). The table is a local path this process and every
executor can read (a local or shared file system), or an S3 URL (``s3://bucket/table``
or ``s3a://``): its log is read on the driver through pyarrow's file systems and its
files by delta-spark through Hadoop's ``s3a`` connector (``spark_conf`` asks for it),
both with the standard AWS settings (``transactional.spark.storage``).
"""

from transactional.sources.delta._spouts import DeltaTableSpout, DeltaVersions

__all__ = ["DeltaTableSpout", "DeltaVersions"]
