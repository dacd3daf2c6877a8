"""Where the records are, seen from the driver: the file layout and the Redis queue
layout, the cheap questions the coordinators ask of them (what exists, how far does
it reach), and the lazy frames whose reading runs in Spark tasks.

The spouts in ``sources`` add the metadata and the Storm contracts on top.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from examples.tweets import lines
from transactional.errors import ConfigurationError, EmitError
from transactional.secrets import redact_url
from transactional.sources.base import SourceBase
from transactional.spout import SpoutContext

if TYPE_CHECKING:
    import pyarrow as pa
    import redis
    from pyspark.sql import DataFrame, SparkSession

#: Bytes of a file range per Spark task.
DEFAULT_SPLIT_BYTES = 32 << 20
#: Messages of a Redis range per Spark task.
DEFAULT_SPLIT_KEYS = 50_000
#: Records of a spout's sample batch (the runner's warm-up).
SAMPLE_LINES = 256

_FILE_SPLIT_SCHEMA = "path STRING, start LONG, end LONG, lo LONG, hi LONG"
_REDIS_SPLIT_SCHEMA = (
    "url STRING, prefix STRING, partition INT, start LONG, count LONG, missing_ok BOOLEAN"
)


def frame(
    spark: SparkSession,
    rows: Sequence[tuple[Any, ...]],
    schema: str,
    reader: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    tasks: int | None = None,
    output: str = lines.RECORD_SCHEMA,
) -> DataFrame:
    """A lazy frame that runs ``reader`` over ``rows``: one Spark task per row, or the
    rows spread over ``tasks`` tasks (each reads its rows one after the other)."""
    if not rows:
        return spark.createDataFrame([], output)
    splits = spark.sparkContext.parallelize(list(rows), min(len(rows), tasks or len(rows)))
    return spark.createDataFrame(splits, schema).mapInArrow(reader, output)


class FileInput(SourceBase):
    """A file or a directory of partition files, seen from the driver."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        batch_size: int = 1000,
        split_bytes: int = DEFAULT_SPLIT_BYTES,
    ) -> None:
        super().__init__(batch_size)
        self.path = Path(path).resolve()
        self.split_bytes = split_bytes

    def identity(self) -> str:
        # The input is part of the identity: offsets stored for one input mean nothing
        # for another, so reusing a topology id with a different --input is refused.
        return f"{type(self).__module__}.{type(self).__qualname__}:{self.path}"

    def names(self) -> list[str]:
        if self.path.is_dir():
            return sorted(
                e.name
                for e in os.scandir(self.path)
                if e.is_file() and not e.name.startswith((".", "_"))
            )
        if self.path.is_file():
            return [self.path.name]
        raise ConfigurationError(
            f"input {self.path} does not exist: pass --input a JSON Lines file or a "
            "directory of them (create one with `python -m examples.tweets generate`)"
        )

    def resolve(self, name: str) -> str:
        return str(self.path / name) if self.path.is_dir() else str(self.path)

    def size(self, name: str) -> int:
        return os.path.getsize(self.resolve(name))

    def scan(self, name: str, offset: int, max_lines: int) -> tuple[int, int]:
        """``(length, count)`` of the next up to ``max_lines`` lines of ``name``."""
        size = self.size(name)
        if size < offset:
            raise EmitError(
                f"{self.resolve(name)} has {size} bytes but {offset} were already read: "
                "it was truncated or replaced; files may only grow by appending lines"
            )
        return lines.scan_lines(self.resolve(name), offset, max_lines)

    def read_partitions(self, ranges: Mapping[int, tuple[str, int, int]]) -> DataFrame:
        """One lazy frame of every partition's ``(file, offset, length)`` range, each row
        tagged with its partition (``emit_partitions``): the splits of all partitions
        spread over as many tasks as the session runs at once, not a task and a Python
        evaluation per partition."""
        rows = [
            (partition, *row)
            for partition, named in sorted(ranges.items())
            for row in self._splits([named], self.split_bytes)
        ]
        return frame(
            self.spark,
            rows,
            f"partition INT, {_FILE_SPLIT_SCHEMA}",
            lines.read_tagged_file_splits,
            self.spark.sparkContext.defaultParallelism,
            lines.TAGGED_RECORD_SCHEMA,
        )

    def sample_batch(self) -> DataFrame | None:
        """The first ``SAMPLE_LINES`` lines of the first file holding any, read as a
        batch is, in as many tasks as the session runs at once (so that every Python
        worker a batch uses is started): the runner's warm-up. None for an empty input."""
        for name in self.names():
            length, _ = self.scan(name, 0, SAMPLE_LINES)
            if length:
                return self.read_ranges([(name, 0, length)], self.per_task(length))
        return None

    def read_ranges(
        self,
        ranges: Iterable[tuple[str, int, int]],
        split_bytes: int | None = None,
        finished: Collection[str] = (),
    ) -> DataFrame:
        """A lazy frame of the ``(file, offset, length)`` ranges, in order, a task per
        ``split_bytes`` (default: the input's).

        A range that is the whole of a file named in ``finished`` (one that no longer
        grows) is read by Spark's own text reader, in the JVM; the others by the range
        reader. Both give the same records for the same bytes (``lines``)."""
        ranges = [r for r in ranges if r[2]]
        whole = self._whole(ranges, finished)
        by_spark = {n: lines.read_text_files(self.spark, [self.resolve(n)]) for n in whole}
        # Spark listed each file as it made its frame: if one changed size since the check
        # above, its listing may not be the range; read them all by range instead.
        if by_spark and self._whole([r for r in ranges if r[0] in whole], finished) != whole:
            by_spark = {}
        split = split_bytes or self.split_bytes
        frames: list[DataFrame] = []
        for spark_reads, group in itertools.groupby(ranges, key=lambda r: r[0] in by_spark):
            if spark_reads:
                frames += [by_spark[name] for name, _, _ in group]
            else:
                rows = self._splits(group, split)
                frames.append(frame(self.spark, rows, _FILE_SPLIT_SCHEMA, lines.read_file_splits))
        if not frames:
            return frame(self.spark, [], _FILE_SPLIT_SCHEMA, lines.read_file_splits)
        return functools.reduce(lambda a, b: a.unionByName(b), frames)

    def _whole(self, ranges: Iterable[tuple[str, int, int]], finished: Collection[str]) -> set[str]:
        """The names of ``ranges`` that are a whole finished file Spark's reader can take."""
        return {
            name
            for name, offset, length in ranges
            if name in finished
            and offset == 0
            and length == self.size(name)
            and lines.readable_by_spark(self.resolve(name))
        }

    def _splits(
        self, ranges: Iterable[tuple[str, int, int]], split_bytes: int
    ) -> list[tuple[str, int, int, int, int]]:
        return [
            row
            for name, offset, length in ranges
            if length
            for row in lines.file_splits(self.resolve(name), offset, length, split_bytes)
        ]


class RedisQueues(SourceBase):
    """The queues ``load`` writes, seen from the driver."""

    #: Transactional kinds must replay exactly, so a lost message is an error for them.
    missing_ok = False

    def __init__(
        self,
        url: str,
        prefix: str = "tweets",
        batch_size: int = 1000,
        split_keys: int = DEFAULT_SPLIT_KEYS,
    ) -> None:
        super().__init__(batch_size)
        self.url = url
        self.prefix = prefix
        self.split_keys = split_keys
        self._client: redis.Redis | None = None

    def identity(self) -> str:
        return f"{type(self).__module__}.{type(self).__qualname__}:{self.prefix}"

    def open(self, context: SpoutContext) -> None:
        super().open(context)
        import redis

        try:
            self.client.ping()
        except redis.RedisError as e:
            raise ConfigurationError(
                f"cannot reach Redis at {redact_url(self.url)} ({e}): start redis-server or fix the URL"
            ) from e

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(
                self.url, socket_connect_timeout=5, socket_timeout=30
            )
        return self._client

    def num_partitions(self) -> int:
        """Probe counters 0, 1, ... in pipelined blocks: O(partitions), never a SCAN of the
        whole key space, which holds every message."""
        n = 0
        while True:
            pipe = self.client.pipeline(transaction=False)
            for p in range(n, n + 32):
                pipe.exists(lines.counter_key(self.prefix, p))
            for found in pipe.execute():
                if not found:
                    return n
                n += 1

    def next_writes(self, partitions: int) -> list[int]:
        pipe = self.client.pipeline(transaction=False)
        for p in range(partitions):
            pipe.get(lines.counter_key(self.prefix, p))
        return [int(v or 0) for v in pipe.execute()]

    def available(self, partition: int, start: int, next_write: int) -> int:
        if next_write < start:
            raise EmitError(
                f"{lines.counter_key(self.prefix, partition)} is {next_write} but {start} messages "
                "were already read: the queue was reset; start a new --topology-id"
            )
        return next_write - start

    def next_write(self, partition: int) -> int:
        return int(self.client.get(lines.counter_key(self.prefix, partition)) or 0)  # type: ignore[arg-type]

    def sample_batch(self) -> DataFrame | None:
        """The first ``SAMPLE_LINES`` messages of the first queue holding any, read as a
        batch is, in as many tasks as the session runs at once: the runner's warm-up.
        None when every queue is empty."""
        for partition, next_write in enumerate(self.next_writes(self.num_partitions())):
            if next_write:
                count = min(SAMPLE_LINES, next_write)
                return self.read_ranges([(partition, 0, count)], self.per_task(count))
        return None

    def read_ranges(
        self, ranges: Iterable[tuple[int, int, int]], split_keys: int | None = None
    ) -> DataFrame:
        """A lazy frame of the ``(partition, start, count)`` ranges, in order, a task per
        ``split_keys`` messages (default: the input's)."""
        split = split_keys or self.split_keys
        rows = [
            row
            for partition, start, count in ranges
            if count
            for row in lines.redis_splits(
                self.url, self.prefix, partition, start, count, self.missing_ok, split
            )
        ]
        return frame(self.spark, rows, _REDIS_SPLIT_SCHEMA, lines.read_redis_splits)


def fair_share(budget: int, available: Sequence[int]) -> list[int]:
    """Split ``budget`` across queues as evenly as their ``available`` counts allow."""
    alloc = [0] * len(available)
    active = [i for i, a in enumerate(available) if a > 0]
    while budget > 0 and active:
        each = max(1, budget // len(active))
        still = []
        for i in active:
            take = min(each, available[i] - alloc[i], budget)
            alloc[i] += take
            budget -= take
            if alloc[i] < available[i]:
                still.append(i)
        active = still
    return alloc
