"""Sinks behind the ``Committer`` interface: Redis and Delta Lake, each in a
transactional and an opaque mode, with counters and an exactly-once dead-letter output."""

from committers.base import CounterTable
from committers.delta import DeltaCommitter, delta_spark_conf
from committers.redis import RedisCommitter

__all__ = ["CounterTable", "DeltaCommitter", "RedisCommitter", "delta_spark_conf"]
