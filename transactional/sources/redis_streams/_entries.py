"""Stream entries: their ids, and the reader that runs in Spark tasks to take a range
of a stream back as records (``transactional.sources.redis_streams``).

The reader's functions are module-level and take only plain values, because Spark
pickles them by reference and runs them in executor processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from transactional.sources.text import INVALID_UTF8
from transactional.spout import PARTITION_COLUMN

__all__ = [
    "RECORD_SCHEMA",
    "SOCKET_TIMEOUT",
    "SPLIT_SCHEMA",
    "before",
    "ceil_millis",
    "entry_id",
    "parse_id",
    "read_stream_splits",
]

#: The records of a stream range.
RECORD_SCHEMA = "stream STRING, id STRING, fields MAP<STRING, STRING>, raw STRING, error STRING"
_ARROW_SCHEMA = pa.schema(
    [
        ("stream", pa.string()),
        ("id", pa.string()),
        ("fields", pa.map_(pa.string(), pa.string())),
        ("raw", pa.string()),
        ("error", pa.string()),
    ]
)
#: A split row: one range of one stream, the value field ("" for none) and the
#: partition to tag its records with (-1: none).
SPLIT_SCHEMA = (
    "url STRING, stream STRING, after STRING, last STRING, count LONG, field STRING, partition INT"
)
#: Seconds a client of the source (the driver's, a task's) waits for a reply. Set, not
#: left to redis-py: its default went from none to 5 s in redis-py 8.
SOCKET_TIMEOUT = 30.0
#: Seconds to connect.
CONNECT_TIMEOUT = 5.0
#: Entries per XRANGE call in a task.
_CHUNK = 10_000
#: The largest sequence number of an entry id.
_MAX_SEQ = 2**64 - 1


def parse_id(entry: str) -> tuple[int, int]:
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq or 0)


def before(entry: str) -> str:
    """The largest id before ``entry`` ("0-0" for the first): an exclusive bound that
    starts a range at ``entry`` itself."""
    ms, seq = parse_id(entry)
    if seq:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{_MAX_SEQ}" if ms else "0-0"


def ceil_millis(t: datetime) -> int:
    """Milliseconds since the epoch of the first millisecond at or after ``t`` (a naive
    ``t`` is local time), in integers: a float would round 1.002 s down to 1001 ms."""
    aware = t if t.tzinfo is not None else t.astimezone()
    since = aware - datetime(1970, 1, 1, tzinfo=UTC)
    return -(-since // timedelta(milliseconds=1))


def entry_id(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _text(value: bytes) -> tuple[str, bool]:
    try:
        return value.decode("utf-8"), True
    except UnicodeDecodeError:
        return value.decode("utf-8", "backslashreplace"), False


def read_stream_range(
    url: str, stream: str, after: str, last: str, count: int, field: str
) -> pa.RecordBatch:
    """The records of the entries of ``stream`` in ``(after, last]``: exactly ``count``
    of them, or the task fails (entries deleted since the range was decided)."""
    import redis

    ids: list[str] = []
    maps: list[list[tuple[str, str]]] = []
    raws: list[str | None] = []
    errors: list[str | None] = []
    client = redis.Redis.from_url(
        url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=SOCKET_TIMEOUT
    )
    try:
        bound = after
        while len(ids) < count:
            chunk: Any = client.xrange(
                stream, f"({bound}", last, count=min(_CHUNK, count - len(ids))
            )
            if not chunk:
                break
            for entry_id, fields in chunk:
                ok = True
                pairs = []
                for name, value in fields.items():
                    key, good_key = _text(name)
                    text, good_value = _text(value)
                    ok = ok and good_key and good_value
                    pairs.append((key, text))
                raw = dict(pairs).get(field) if field else None
                error = None if ok else INVALID_UTF8
                if field and raw is None and error is None:
                    error = f"no field {field!r}"
                ids.append(entry_id.decode())
                maps.append(pairs)
                raws.append(raw)
                errors.append(error)
            bound = ids[-1]
    finally:
        client.close()
    if len(ids) != count:
        raise LookupError(
            f"stream {stream!r} holds {len(ids)} entries after {after} up to {last}, not the "
            f"{count} its batch took: they were deleted since"
        )
    return pa.RecordBatch.from_arrays(
        [
            pa.array([stream] * len(ids), pa.string()),
            pa.array(ids, pa.string()),
            pa.array(maps, pa.map_(pa.string(), pa.string())),
            pa.array(raws, pa.string()),
            pa.array(errors, pa.string()),
        ],
        schema=_ARROW_SCHEMA,
    )


def read_stream_splits(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body over ``_SPLIT_SCHEMA`` rows."""
    for batch in batches:
        for row in batch.to_pylist():
            records = read_stream_range(
                row["url"], row["stream"], row["after"], row["last"], row["count"], row["field"]
            )
            if row["partition"] >= 0:
                tag = pa.array([row["partition"]] * records.num_rows, pa.int32())
                records = records.append_column(PARTITION_COLUMN, tag)
            yield records
