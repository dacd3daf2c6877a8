"""Sinks behind the ``Committer`` interface: Redis and Delta Lake, each in a
transactional and an opaque mode, with aggregate states (counters, counts, minimums,
maximums, last values) and an exactly-once dead-letter output."""

from committers.delta import DeltaCommitter, DeltaSnapshot, delta_spark_conf
from committers.keys import decode_key, encode_key
from committers.redis import RedisCommitter, RedisSnapshot
from committers.states import Count, Last, Max, Min, Sum
from committers.tables import CounterTable

__all__ = [
    "Count",
    "CounterTable",
    "DeltaCommitter",
    "DeltaSnapshot",
    "Last",
    "Max",
    "Min",
    "RedisCommitter",
    "RedisSnapshot",
    "Sum",
    "decode_key",
    "delta_spark_conf",
    "encode_key",
]
