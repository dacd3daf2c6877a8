"""Kafka: one topic's partitions as spout partitions, each txid an offset range per
partition, the offsets decided on the driver and the records read by Spark's own Kafka
connector: its Kafka RDD built over the decided ranges on a classic session
(``_direct.py``), its batch reader (``spark.read.format("kafka")`` with
``startingOffsets``/``endingOffsets``) over Spark Connect.

- ``KafkaPartitionedSpout`` replays a txid's ranges exactly. A range that retention
  deleted before its replay cannot be replayed: the run stops with
  ``SourceDataLostError`` naming the range (never a silent skip).
- ``KafkaOpaqueSpout`` is for topics whose retention may delete a range before it is
  read or replayed; with an opaque committer the results stay exact for what was
  read. Offsets deleted before they were read are not skipped silently: the batch
  carries one row for the gap, its ``error`` naming the offsets, which a bolt sends to
  the dead letters.

Records: ``value_format="text"`` (the default) gives text records ``raw, error``
(``transactional.sources.text``: a value that is not UTF-8 is flagged, not dropped; a
record without a value, a tombstone, has ``raw`` null and ``error`` saying so)
followed by ``key, topic, partition, offset, timestamp``; ``"binary"`` gives Spark's
Kafka columns (``key, value, topic, partition, offset, timestamp, timestampType``)
and ``error``.

Offsets are read with ``read_committed`` by default: a range ends at most at the last
stable offset, so records of open or aborted producer transactions are never in a
batch. Ranges count offsets, not records: compacted topics and transaction markers
leave offsets without records, so a txid may hold fewer records than its range's size
(even none: such a txid is committed all the same, to move on).

Start positions, for the partitions that exist when the topology starts
(``start=``): ``"earliest"``, ``"latest"``, ``{partition: offset}`` (partitions not
named start at the earliest), or a ``datetime`` (the first offset at or after it).
A partition added to the topic later starts at its earliest offset, as Structured
Streaming does, so nothing written to it is missed.
"""

from transactional.sources.kafka._spouts import (
    KafkaOpaqueSpout,
    KafkaPartitionedSpout,
    KafkaRange,
    kafka_spark_conf,
)

__all__ = ["KafkaOpaqueSpout", "KafkaPartitionedSpout", "KafkaRange", "kafka_spark_conf"]
