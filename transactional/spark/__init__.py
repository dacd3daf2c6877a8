"""The Spark plumbing: the session (``session``; users build theirs with
``transactional.session``), the engine the runtime drives (``engine``), Spark Connect
(``connect``), jars (``jars``), local and S3 storage (``storage``), kept batches
(``checkpoints``), column expressions built once per session (``columns``), the plans
of a txid re-pointed for the next (``_replan``), the record ids of a batch (``ids``),
and the filter of the JVM's stderr (``stderr_filter``).

What a topology's code may use of it: ``Prebuilt`` for a bolt's columns,
``checkpoint`` for a batch a committer keeps, and ``s3_spark_conf`` for tables in S3."""

from transactional.spark.checkpoints import checkpoint
from transactional.spark.columns import Prebuilt
from transactional.spark.storage import s3_spark_conf

__all__ = ["Prebuilt", "checkpoint", "s3_spark_conf"]
