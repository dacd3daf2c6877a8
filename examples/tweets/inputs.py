"""The demo's Redis queues, seen from the driver: the cheap questions the coordinators
ask of them (how many queues, how far each reaches), and the lazy frames whose reading
runs in Spark tasks. (Its files are read by the library's file source,
``transactional.sources.files``.)

The spouts in ``sources`` add the metadata and the Storm contracts on top.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from examples.tweets import lines
from transactional.errors import ConfigurationError, EmitError
from transactional.secrets import redact_url
from transactional.sources.base import SourceBase, split_frame
from transactional.sources.files import SAMPLE_LINES
from transactional.spout import SpoutContext

if TYPE_CHECKING:
    import redis
    from pyspark.sql import DataFrame

#: Messages of a Redis range per Spark task.
DEFAULT_SPLIT_KEYS = 50_000
_REDIS_SPLIT_SCHEMA = (
    "url STRING, prefix STRING, partition INT, start LONG, count LONG, missing_ok BOOLEAN"
)


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
        return split_frame(self.spark, rows, _REDIS_SPLIT_SCHEMA, lines.read_redis_splits)


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
