"""What an attempt keeps in Spark until it is over: ``checkpoint``, a local
checkpoint on a classic session and a persisted frame on Spark Connect, which the
runner's engine releases with the attempt (``transactional.spark.engine``)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from transactional.spark.connect import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KEPT", "checkpoint"]

#: The frames the calling thread's attempt persisted on Spark Connect
#: (``ConnectEngine.mark`` starts the list, ``ConnectEngine.release`` unpersists it).
KEPT = threading.local()


def checkpoint(frame: DataFrame, eager: bool = False) -> DataFrame:
    """``frame`` read once and kept until its attempt is over, then released by the
    runner: a local checkpoint on a classic session (``eager``: made now); on Spark
    Connect, where a released checkpoint's blocks stay on the server until its JVM
    collects them, the frame persisted (``MEMORY_AND_DISK``; ``eager``: stored now, by
    a count) and unpersisted when the attempt is over. Use it in a bolt or committer
    instead of ``localCheckpoint``."""
    if not is_connect(frame.sparkSession):
        return frame.localCheckpoint(eager=eager)
    from pyspark import StorageLevel

    kept = frame.persist(StorageLevel.MEMORY_AND_DISK)
    held = getattr(KEPT, "frames", None)
    if held is not None:
        held.append(kept)
    if eager:  # stored now (a Delta MERGE refuses a source that gets cached under it)
        kept.count()
    return kept
