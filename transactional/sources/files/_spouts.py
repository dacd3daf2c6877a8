"""The file spouts (``transactional.sources.files`` says what they promise)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from pydantic import Field

from transactional.errors import ConfigurationError, EmitError
from transactional.sources.files._input import (
    DEFAULT_SPLIT_BYTES,
    DEFAULT_SPLIT_ROWS,
    SAMPLE_LINES,
    FileFormat,
    FileInput,
    FileRange,
    FileStart,
)
from transactional.spout import (
    OpaquePartitionedTransactionalSpout,
    PartitionedTransactionalSpout,
    TransactionalSpout,
)
from transactional.types import BatchMetadata, TransactionAttempt

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "DEFAULT_SPLIT_BYTES",
    "DEFAULT_SPLIT_ROWS",
    "SAMPLE_LINES",
    "FileFormat",
    "FileRange",
    "FileSequenceMeta",
    "FileStart",
    "FilesOpaqueSpout",
    "FilesPartitionedSpout",
    "FilesTransactionalSpout",
]


class FileSequenceMeta(BatchMetadata):
    """A transactional batch over the files read as one sequence: the ranges it takes
    (possibly spanning files), and where the next batch starts (``file`` "" = the first
    file), which an empty batch must carry forward too."""

    segments: tuple[FileRange, ...] = ()
    file: str = ""
    offset: int = Field(default=0, ge=0)

    @property
    def count(self) -> int:
        return sum(s.count for s in self.segments)


class FilesTransactionalSpout(FileInput, TransactionalSpout[FileSequenceMeta]):
    """The files as one sequence in name order; ``batch_size`` records per txid."""

    #: What stores hold for this class (``identity``); never changes.
    stored_name = "transactional.sources.files.FilesTransactionalSpout"

    metadata_type = FileSequenceMeta

    def _position(self, prev_meta: FileSequenceMeta | None) -> tuple[str, int]:
        """Where the next batch starts: after ``prev_meta``, or at ``start``."""
        if prev_meta is not None:
            return prev_meta.file, prev_meta.offset
        start, names = self.start, [n for n in self.names() if n in self._at_open]
        if start == "earliest" or not names:
            return "", 0
        if start == "latest":
            return names[-1], self._at_open[names[-1]]
        if isinstance(start, datetime):
            newer = [n for n in names if os.stat(self.resolve(n)).st_mtime >= start.timestamp()]
            return (newer[0], 0) if newer else (names[-1], self._at_open[names[-1]])
        ((name, offset),) = start.items()
        return name, offset

    def _check_start(self, names: list[str]) -> None:
        if isinstance(self.start, Mapping) and len(self.start) != 1:
            raise ConfigurationError(
                f"{self.who}: reads its files as one sequence, so start= names one file "
                f"and offset ({{'part-00003.jsonl': 0}}), not {len(self.start)}"
            )
        super()._check_start(names)

    def is_ready(self, txid: int, prev_meta: FileSequenceMeta | None) -> bool:
        file, offset = self._position(prev_meta)
        behind = {}
        for name in self.names():
            if name >= file:
                begin = self.data_start(name)
                begin = max(offset, begin) if name == file else begin
                behind[name] = max(0, self.size(name) - begin)
        self._behind = behind
        return any(behind.values())

    def initialize_transaction(
        self, txid: int, prev_meta: FileSequenceMeta | None
    ) -> FileSequenceMeta:
        file, offset = self._position(prev_meta)
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

    def batch_ranges(self, meta: FileSequenceMeta) -> list[FileRange]:
        return list(meta.segments)

    def emit_batch(self, attempt: TransactionAttempt, meta: FileSequenceMeta) -> DataFrame:
        # A file followed by another is finished (the sequence has moved past it): a
        # segment that is all of one is read by Spark's own reader.
        names = self.names()
        finished = set(names[:-1]) if len(names) > 1 else set()
        return self.read_ranges(
            ((r.file, r.offset, r.length) for r in meta.segments), finished=finished
        )


class _FilePartitions(FileInput):
    def num_partitions(self) -> int:
        return len(self.names())

    def partition_file(
        self, partition: int, last_meta: FileRange | None, names: list[str] | None = None
    ) -> str:
        names = self.names() if names is None else names
        if partition >= len(names):
            raise EmitError(
                f"{self.who}: partition {partition} is gone: {self.path} now holds "
                f"{len(names)} files; partition files must never be removed"
            )
        name = names[partition]
        if last_meta is not None and last_meta.file != name:
            raise EmitError(
                f"{self.who}: partition {partition} was {last_meta.file!r} and is now "
                f"{name!r}: a file was renamed, removed or inserted before it; give new "
                "files names that sort after the existing ones, or start a new topology id"
            )
        return name

    def batch_ranges(self, meta: Mapping[int, FileRange]) -> list[FileRange]:
        return [meta[p] for p in sorted(meta)]

    def is_ready(self, txid: int, last_metas: Mapping[int, FileRange]) -> bool:
        self._fresh = not last_metas
        names = self.names()
        behind = {}
        for partition in range(len(names)):
            last = last_metas.get(partition)
            name = self.partition_file(partition, last, names)
            behind[name] = max(0, self.size(name) - (last.end if last else self.start_of(name)))
        self._behind = behind
        return any(behind.values())

    def next_range(self, partition: int, last_meta: FileRange | None) -> FileRange:
        name = self.partition_file(partition, last_meta)
        start = last_meta.end if last_meta else self.start_of(name)
        return self.take(name, start, self.next_batch_size())


class FilesPartitionedSpout(_FilePartitions, PartitionedTransactionalSpout[FileRange]):
    """One partition per file; ``batch_size`` records per partition per txid."""

    #: What stores hold for this class (``identity``); never changes.
    stored_name = "transactional.sources.files.FilesPartitionedSpout"

    metadata_type = FileRange

    def emit_partition_batch_new(
        self, attempt: TransactionAttempt, partition: int, last_meta: FileRange | None
    ) -> FileRange:
        return self.next_range(partition, last_meta)

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, meta: FileRange
    ) -> DataFrame:
        return self.read_ranges([(meta.file, meta.offset, meta.length)])

    def emit_partitions(
        self, attempt: TransactionAttempt, metas: Mapping[int, FileRange]
    ) -> DataFrame:
        return self.read_partitions({p: (m.file, m.offset, m.length) for p, m in metas.items()})


class FilesOpaqueSpout(_FilePartitions, OpaquePartitionedTransactionalSpout[FileRange]):
    """The partitioned file spout's ranges, for an opaque committer."""

    #: What stores hold for this class (``identity``); never changes.
    stored_name = "transactional.sources.files.FilesOpaqueSpout"

    metadata_type = FileRange

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, last_meta: FileRange | None
    ) -> tuple[FileRange, DataFrame]:
        meta = self.next_range(partition, last_meta)
        return meta, self.read_ranges([(meta.file, meta.offset, meta.length)])
