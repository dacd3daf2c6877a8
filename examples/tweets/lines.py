"""The demo's Redis queues: where ``load`` puts each line, and the reader that runs in
Spark tasks to take a range of them back.

A message is one line's bytes, framed and decoded by the rule every line-framed source
keeps (``transactional.sources.files._lines``): the Redis spouts give the same records for a
message as the file spouts give for the line it came from.

The reader's functions are module-level and take only plain values, because Spark
pickles them by reference and runs them in executor processes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from transactional.sources.files import records_batch

#: Keys per MGET: big enough to amortise round trips, small enough not to stall Redis.
_MGET = 1000


def message_key(prefix: str, partition: int, index: int) -> str:
    return f"{prefix}:{partition}:{index}"


def counter_key(prefix: str, partition: int) -> str:
    return f"{prefix}:{partition}:next_write"


def read_redis_split(
    url: str, prefix: str, partition: int, start: int, count: int, missing_ok: bool
) -> pa.RecordBatch:
    """The records of messages ``start .. start+count-1`` of one queue.

    A missing message means the source lost data: fatal for a replayable (transactional)
    batch, whose records must not change; skipped for an opaque one, which may differ.
    """
    import redis

    lines: list[bytes] = []
    client = redis.Redis.from_url(url)
    try:
        for lo in range(start, start + count, _MGET):
            keys = [
                message_key(prefix, partition, i) for i in range(lo, min(lo + _MGET, start + count))
            ]
            for key, value in zip(keys, client.mget(keys), strict=True):
                if value is None:
                    if missing_ok:
                        continue
                    raise LookupError(
                        f"Redis message {key} is missing: the queue lost data that a stored "
                        "batch refers to, so the batch cannot be replayed exactly"
                    )
                lines.append(value if isinstance(value, bytes) else value.encode())
    finally:
        client.close()
    return records_batch(lines)


def read_redis_splits(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body over rows ``(url, prefix, partition, start, count, missing_ok)``."""
    for batch in batches:
        for row in batch.to_pylist():
            yield read_redis_split(
                row["url"],
                row["prefix"],
                row["partition"],
                row["start"],
                row["count"],
                row["missing_ok"],
            )


def redis_splits(
    url: str, prefix: str, partition: int, start: int, count: int, missing_ok: bool, split_keys: int
) -> list[tuple[str, str, int, int, int, bool]]:
    """Rows for ``read_redis_splits``: one task per ``split_keys`` messages."""
    step = max(1, split_keys)
    return [
        (url, prefix, partition, lo, min(step, start + count - lo), missing_ok)
        for lo in range(start, start + count, step)
    ]
