"""Spouts over the two tweet sources, in all three spout kinds.

**Files** (``--input PATH``): a JSON Lines file is partition 0; a directory holds one
partition per regular file, in sorted name order (names starting with ``.`` or ``_``
are skipped, as Spark and Hadoop do for their marker files). Partition numbers are
positions in that order, so new partition files must have names that sort last
(``part-00004.jsonl`` after ``part-00003.jsonl``); partition metadata names its file,
so a renamed or inserted file is refused instead of silently misread. Files may only
grow by appending whole lines (see ``lines`` for the framing rule). The transactional
file spout reads a directory as one sequence across its files, in name order: a file
counts as finished once a later file exists.

**Redis** (after ``load``): per partition ``p``, messages ``<prefix>:<p>:<i>`` for
``i < <prefix>:<p>:next_write``; partitions are numbered from 0 without gaps.

**batch_size** is records per partition per txid for the partitioned and opaque kinds
(like Storm's per-partition batch limit, and so that a partition's range depends on
that partition alone), and records per txid in total for the transactional kinds (the
Redis one shares it fairly across the queues that have data).

The coordinator side (``is_ready``, ``initialize_transaction``,
``emit_partition_batch_new``) runs on the driver and only counts: newlines in big
chunks for files, counters for Redis. The emitters return lazy DataFrames over small
"split" rows whose reading happens in Spark tasks, one task per split, so partitions
are read in parallel by the executors; a transactional batch's segment that is a whole
finished file is read by Spark's own text reader instead (``FileInput.read_ranges``). Paths must be visible to the executors
(a shared file system on a cluster); they are made absolute for that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pydantic import Field

from examples.tweets.inputs import FileInput, RedisQueues, fair_share
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
    "FileOpaqueSpout",
    "FilePartitionedSpout",
    "FileRange",
    "FileSequenceMeta",
    "FileTransactionalSpout",
    "RedisOpaqueSpout",
    "RedisPartitionedSpout",
    "RedisQueueRange",
    "RedisRange",
    "RedisSequenceMeta",
    "RedisTransactionalSpout",
]


class FileRange(BatchMetadata):
    """``count`` lines in bytes ``[offset, offset + length)`` of ``file`` (a name inside
    the input directory, or the input file's own name)."""

    file: str
    offset: int = Field(ge=0)
    length: int = Field(ge=0)
    count: int = Field(ge=0)

    @property
    def end(self) -> int:
        return self.offset + self.length


class FileSequenceMeta(BatchMetadata):
    """A transactional batch over a directory read as one sequence: the ranges it takes
    (possibly spanning files), and where the next batch starts (``file`` "" = the first
    file), which an empty batch must carry forward too."""

    segments: tuple[FileRange, ...] = ()
    file: str = ""
    offset: int = Field(default=0, ge=0)

    @property
    def count(self) -> int:
        return sum(s.count for s in self.segments)


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


class _FileSpout(FileInput):
    def take(self, name: str, offset: int, max_lines: int) -> FileRange:
        length, count = self.scan(name, offset, max_lines)
        return FileRange(file=name, offset=offset, length=length, count=count)

    def read(self, ranges: Sequence[FileRange]) -> DataFrame:
        return self.read_ranges((r.file, r.offset, r.length) for r in ranges)


class FileTransactionalSpout(_FileSpout, TransactionalSpout[FileSequenceMeta]):
    """One sequence of lines across the input's files; ``batch_size`` lines per txid."""

    metadata_type = FileSequenceMeta

    def is_ready(self, txid: int, prev_meta: FileSequenceMeta | None) -> bool:
        file, offset = (prev_meta.file, prev_meta.offset) if prev_meta else ("", 0)
        for name in self.names():
            if (name == file and self.size(name) > offset) or (name > file and self.size(name)):
                return True
        return False

    def initialize_transaction(
        self, txid: int, prev_meta: FileSequenceMeta | None
    ) -> FileSequenceMeta:
        file, offset = (prev_meta.file, prev_meta.offset) if prev_meta else ("", 0)
        segments: list[FileRange] = []
        need = self.next_batch_size()
        for name in (n for n in self.names() if n >= file):
            taken = self.take(name, offset if name == file else 0, need)
            if taken.count:
                segments.append(taken)
            file, offset, need = name, taken.end, need - taken.count
            if need == 0:
                break
        return FileSequenceMeta(segments=tuple(segments), file=file, offset=offset)

    def emit_batch(self, attempt: TransactionAttempt, meta: FileSequenceMeta) -> DataFrame:
        # A file followed by another is finished (the sequence has moved past it): a
        # segment that is all of one is read by Spark's own reader (FileInput.read_ranges).
        names = self.names()
        finished = set(names[:-1]) if len(names) > 1 else set()
        return self.read_ranges(
            ((r.file, r.offset, r.length) for r in meta.segments), finished=finished
        )


class _FilePartitions(_FileSpout):
    def num_partitions(self) -> int:
        return len(self.names())

    def partition_file(
        self, partition: int, last_meta: FileRange | None, names: list[str] | None = None
    ) -> str:
        names = self.names() if names is None else names
        if partition >= len(names):
            raise EmitError(
                f"partition {partition} is gone: {self.path} now holds {len(names)} files; "
                "partition files must never be removed"
            )
        name = names[partition]
        if last_meta is not None and last_meta.file != name:
            raise EmitError(
                f"partition {partition} was {last_meta.file!r} and is now {name!r}: a file was "
                "renamed, removed or inserted before it; give new partition files names that "
                "sort after the existing ones, or start a new --topology-id"
            )
        return name

    def is_ready(self, txid: int, last_metas: Mapping[int, FileRange]) -> bool:
        names = self.names()
        for partition in range(len(names)):
            last = last_metas.get(partition)
            name = self.partition_file(partition, last, names)
            if self.size(name) > (last.end if last else 0):
                return True
        return False

    def next_range(self, partition: int, last_meta: FileRange | None) -> FileRange:
        name = self.partition_file(partition, last_meta)
        return self.take(name, last_meta.end if last_meta else 0, self.next_batch_size())


class FilePartitionedSpout(_FilePartitions, PartitionedTransactionalSpout[FileRange]):
    """One partition per file; ``batch_size`` lines per partition per txid."""

    metadata_type = FileRange

    def emit_partition_batch_new(
        self, attempt: TransactionAttempt, partition: int, last_meta: FileRange | None
    ) -> FileRange:
        return self.next_range(partition, last_meta)

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, meta: FileRange
    ) -> DataFrame:
        return self.read([meta])

    def emit_partitions(
        self, attempt: TransactionAttempt, metas: Mapping[int, FileRange]
    ) -> DataFrame:
        return self.read_partitions({p: (m.file, m.offset, m.length) for p, m in metas.items()})


class FileOpaqueSpout(_FilePartitions, OpaquePartitionedTransactionalSpout[FileRange]):
    """The partitioned file spout's ranges, without the promise of exact replays."""

    metadata_type = FileRange

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, last_meta: FileRange | None
    ) -> tuple[FileRange, DataFrame]:
        meta = self.next_range(partition, last_meta)
        return meta, self.read([meta])


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
