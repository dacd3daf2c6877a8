"""The demo's spouts over its Redis queues, in all three spout kinds; its files are
read by the library's file spouts (``transactional.sources.files``), which the CLI
picks for ``--source files``.

**Redis** (after ``load``): per partition ``p``, messages ``<prefix>:<p>:<i>`` for
``i < <prefix>:<p>:next_write``; partitions are numbered from 0 without gaps.

**batch_size** is messages per partition per txid for the partitioned and opaque kinds
(like Storm's per-partition batch limit, and so that a partition's range depends on
that partition alone), and messages per txid in total for the transactional kind
(shared fairly across the queues that have data).

The coordinator side (``is_ready``, ``initialize_transaction``,
``emit_partition_batch_new``) runs on the driver and only reads counters. The emitters
return lazy DataFrames over small "split" rows whose reading happens in Spark tasks,
one task per split, so queues are read in parallel by the executors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pydantic import Field

from examples.tweets.inputs import RedisQueues, fair_share
from transactional.errors import EmitError
from transactional.spout import (
    OpaquePartitionedTransactionalSpout,
    PartitionedTransactionalSpout,
    TransactionalSpout,
)
from transactional.types import BatchMetadata, TransactionAttempt

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "RedisOpaqueSpout",
    "RedisPartitionedSpout",
    "RedisQueueRange",
    "RedisRange",
    "RedisSequenceMeta",
    "RedisTransactionalSpout",
]


class RedisRange(BatchMetadata):
    """Messages ``start .. start + count - 1`` of one queue."""

    start: int = Field(ge=0)
    count: int = Field(ge=0)

    @property
    def end(self) -> int:
        return self.start + self.count


class RedisQueueRange(RedisRange):
    partition: int = Field(ge=0)


class RedisSequenceMeta(BatchMetadata):
    """A transactional batch over all queues: one range per queue known at the time."""

    ranges: tuple[RedisQueueRange, ...] = ()

    @property
    def count(self) -> int:
        return sum(r.count for r in self.ranges)


class RedisTransactionalSpout(RedisQueues, TransactionalSpout[RedisSequenceMeta]):
    """All queues as one stream of batches; ``batch_size`` messages per txid, shared."""

    metadata_type = RedisSequenceMeta

    def _positions(self, prev_meta: RedisSequenceMeta | None) -> tuple[list[int], list[int]]:
        n = self.num_partitions()
        starts = [0] * n
        for r in prev_meta.ranges if prev_meta else ():
            if r.partition >= n:
                raise EmitError(
                    f"queue {self.prefix}:{r.partition} is gone; queues must never be removed"
                )
            starts[r.partition] = r.end
        return starts, self.next_writes(n)

    def is_ready(self, txid: int, prev_meta: RedisSequenceMeta | None) -> bool:
        starts, ends = self._positions(prev_meta)
        return any(
            self.available(p, s, e) for p, (s, e) in enumerate(zip(starts, ends, strict=True))
        )

    def initialize_transaction(
        self, txid: int, prev_meta: RedisSequenceMeta | None
    ) -> RedisSequenceMeta:
        starts, ends = self._positions(prev_meta)
        avail = [self.available(p, s, e) for p, (s, e) in enumerate(zip(starts, ends, strict=True))]
        counts = fair_share(self.next_batch_size(), avail)
        return RedisSequenceMeta(
            ranges=tuple(
                RedisQueueRange(partition=p, start=s, count=c)
                for p, (s, c) in enumerate(zip(starts, counts, strict=True))
            )
        )

    def emit_batch(self, attempt: TransactionAttempt, meta: RedisSequenceMeta) -> DataFrame:
        return self.read_ranges((r.partition, r.start, r.count) for r in meta.ranges)


class _RedisPartitions(RedisQueues):
    def is_ready(self, txid: int, last_metas: Mapping[int, RedisRange]) -> bool:
        n = self.num_partitions()
        ends = self.next_writes(n)
        return any(
            self.available(p, last_metas[p].end if p in last_metas else 0, ends[p])
            for p in range(n)
        )

    def next_range(self, partition: int, last_meta: RedisRange | None) -> RedisRange:
        start = last_meta.end if last_meta else 0
        end = self.next_write(partition)
        return RedisRange(
            start=start, count=min(self.next_batch_size(), self.available(partition, start, end))
        )


class RedisPartitionedSpout(_RedisPartitions, PartitionedTransactionalSpout[RedisRange]):
    """One partition per queue; ``batch_size`` messages per partition per txid."""

    metadata_type = RedisRange

    def emit_partition_batch_new(
        self, attempt: TransactionAttempt, partition: int, last_meta: RedisRange | None
    ) -> RedisRange:
        return self.next_range(partition, last_meta)

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, meta: RedisRange
    ) -> DataFrame:
        return self.read_ranges([(partition, meta.start, meta.count)])


class RedisOpaqueSpout(_RedisPartitions, OpaquePartitionedTransactionalSpout[RedisRange]):
    """Like the partitioned Redis spout, but a lost message is skipped, not fatal: an
    opaque batch may differ on replay, and opaque committers undo the earlier one."""

    metadata_type = RedisRange
    missing_ok = True

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, last_meta: RedisRange | None
    ) -> tuple[RedisRange, DataFrame]:
        meta = self.next_range(partition, last_meta)
        return meta, self.read_ranges([(partition, meta.start, meta.count)])
