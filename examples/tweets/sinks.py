"""The demo's two sinks: building their committers, and reading the counts back.

The committers live in ``committers`` and are imported inside the functions, so that
generating or loading data never needs them (nor Delta's jars). Redis is read through
the committer's own reads (``RedisCommitter.read``: hashes named after the tables, each
behind ``--redis-key-prefix``, found on the right node of a Redis Cluster); Delta tables
are read at ``<path>/<table>`` (a ``count`` column, the current value in both modes)
and ``<path>/dead_letters``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from examples.tweets.bolts import DEAD_LETTERS, HASHTAGS, TWEET_IDS, USERS, USERS_HASHTAGS
from transactional.errors import ConfigurationError
from transactional.types import CommitMode

if TYPE_CHECKING:
    from transactional.committer import Committer

__all__ = [
    "TABLE_KEYS",
    "Summary",
    "counter_tables",
    "make_committer",
    "read_summary",
    "spark_conf",
]

#: Counter table -> its key columns, as the count bolt emits them.
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    HASHTAGS: ("hashtag",),
    USERS: ("user",),
    USERS_HASHTAGS: ("user", "hashtag"),
}


def counter_tables(record_ids: bool = False) -> dict[str, Any]:
    """The ``counters=`` argument of both committers (``record_ids``: and ``tweet_ids``,
    a count per tweet id)."""
    from committers import CounterTable

    tables = {name: CounterTable(name, keys) for name, keys in TABLE_KEYS.items()}
    if record_ids:
        tables[TWEET_IDS] = CounterTable(TWEET_IDS, ("id",), key_types={"id": "bigint"})
    return tables


def make_committer(
    sink: str,
    mode: CommitMode,
    *,
    delta_path: str | None = None,
    redis_url: str | None = None,
    redis_key_prefix: str = "",
    record_ids: bool = False,
) -> Committer:
    if sink == "delta":
        from committers import DeltaCommitter

        assert delta_path is not None
        return DeltaCommitter(
            delta_path, counter_tables(record_ids), dead_letters=DEAD_LETTERS, mode=mode
        )
    if sink == "redis":
        from committers import RedisCommitter

        assert redis_url is not None
        return RedisCommitter(
            redis_url,
            counter_tables(record_ids),
            dead_letters=DEAD_LETTERS,
            mode=mode,
            key_prefix=redis_key_prefix,
        )
    raise ConfigurationError(f"unknown sink {sink!r}: use delta or redis")


def spark_conf(sink: str, delta_path: str | None = None) -> dict[str, str]:
    """What the sink needs from the SparkSession: Delta's jars and extensions, and for
    tables in S3 (``delta_path``) the ``s3a`` connector."""
    if sink not in ("delta", "both"):
        return {}
    from committers import delta_spark_conf
    from transactional.session import merged
    from transactional.spark.storage import is_s3, s3_spark_conf

    if delta_path is not None and is_s3(delta_path):
        return merged(delta_spark_conf(), s3_spark_conf())
    return dict(delta_spark_conf())


@dataclass
class Summary:
    """The top rows of each counter table (key, count), and the dead-letter total."""

    tops: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    dead_letters: int = 0


def _top(pairs: list[tuple[str, int]], n: int) -> list[tuple[str, int]]:
    # Ties by key, so the same data always prints the same list.
    return sorted(pairs, key=lambda kv: (-kv[1], kv[0]))[:n]


def read_summary(
    sink: str,
    n: int,
    *,
    delta_path: str | None = None,
    redis_url: str | None = None,
    redis_key_prefix: str = "",
    tables: tuple[str, ...] = tuple(TABLE_KEYS),
) -> Summary:
    if sink == "redis":
        assert redis_url is not None
        return _read_redis(redis_url, redis_key_prefix, n, tables)
    assert delta_path is not None
    return _read_delta(delta_path, n, tables)


def _read_redis(url: str, prefix: str, n: int, tables: tuple[str, ...]) -> Summary:
    """Through the committer's reads: on a Redis Cluster they go to the keys' master."""
    from committers import RedisCommitter

    reader = RedisCommitter(url, counter_tables(), key_prefix=prefix, socket_timeout=5)
    summary = Summary()
    for table in tables:
        # Labelled as the Delta reader does (concat_ws: the columns joined by ':').
        counts = [
            (":".join(c for c in key if c is not None), int(v))
            for key, v in reader.read(table).items()
        ]
        summary.tops[table] = _top([kv for kv in counts if kv[1]], n)
    summary.dead_letters = reader.dead_letter_count()
    return summary


def _read_delta(path: str, n: int, tables: tuple[str, ...]) -> Summary:
    """The tables' latest versions, read with delta-rs (the ``deltalake`` package)."""
    from deltalake import DeltaTable

    def read_table(location: str, columns: list[str]) -> Any:
        return DeltaTable(location).to_pyarrow_table(columns=columns)

    root = path.rstrip("/")  # a directory or a bucket's URL: joined with "/", not as a Path
    missing = [t for t in (*tables, DEAD_LETTERS) if not DeltaTable.is_deltatable(f"{root}/{t}")]
    if missing:
        raise ConfigurationError(
            f"no Delta table at {root}/{missing[0]}: nothing was committed to --delta-path "
            f"{root} yet; run `python -m examples.tweets run` first, or pass the path it used"
        )
    summary = Summary()
    for table in tables:
        keys = TABLE_KEYS[table]
        data = read_table(f"{root}/{table}", [*keys, "count"])
        columns = [data.column(k).to_pylist() for k in keys]
        # Labelled as Redis keys are (Spark's concat_ws: the non-null columns, ':').
        labels = [":".join(v for v in row if v is not None) for row in zip(*columns, strict=True)]
        counts = zip(labels, data.column("count").to_pylist(), strict=True)
        summary.tops[table] = _top([(k, int(c)) for k, c in counts if c], n)
    summary.dead_letters = read_table(f"{root}/{DEAD_LETTERS}", ["txid"]).num_rows
    return summary
