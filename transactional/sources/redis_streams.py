"""Redis Streams: N streams as spout partitions, each txid an entry-id range per stream,
decided on the driver and read in Spark tasks with ``XRANGE`` (Redis 7.0 or later).

- ``RedisStreamsPartitionedSpout`` replays a txid's ranges exactly. A range whose
  entries were trimmed (``XTRIM``, ``MAXLEN``) or deleted (``XDEL``) before its txid
  committed cannot be replayed, and entries lost before they were ever read cannot be
  counted: either stops the run with ``SourceDataLostError`` naming them, never a
  silent skip.
- ``RedisStreamsOpaqueSpout`` is for streams that are trimmed while the topology runs:
  each batch starts after the last committed one, and when entries after it were lost
  before they were read, the batch carries one row whose ``error`` says how many were
  trimmed (or that some were deleted, and the last of them) for the dead letters.

A range is ``(after, last]``: the entries after id ``after`` up to id ``last``, with
their ``count``; deciding one asks Redis for the count and the last id of the next
``batch_size`` entries (a script: the entries themselves stay in Redis). Each range
also keeps the stream's ``entries-added`` count at its end (``position``): entries
trimmed before they were read are what the stream had been given before its first
entry beyond that position; an ``XDEL`` is seen in ``max-deleted-entry-id``. The same
count gives ``lag()``.

Records: ``stream, id, fields, raw, error``: ``fields`` is the entry as a
``MAP<STRING, STRING>``; ``raw`` is the value of the field named ``value_field`` (for
entries that carry one document, ``XADD s * data '{...}'``), null without one; a name
or value that is not UTF-8 is escaped as Python's ``backslashreplace`` does and the
record flagged ``error = "invalid UTF-8"``; an entry without ``value_field`` is
flagged too.

Start positions (``start=``), for the streams of a fresh topology: ``"earliest"`` (the
default), ``"latest"`` (entries added after the start), ``{stream: id}`` (the first
entry at or after that id; other streams from their beginning) or a ``datetime`` (the
first entry at or after it: ids begin with their time in milliseconds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from transactional.errors import ConfigurationError, EmitError, SourceDataLostError
from transactional.preflight import SECONDS, check_redis
from transactional.secrets import redact_url
from transactional.sources.base import SourceBase, parse_start, split_frame
from transactional.sources.stream_entries import (
    RECORD_SCHEMA,
    SPLIT_SCHEMA,
    before,
    ceil_millis,
    entry_id,
    parse_id,
    read_stream_splits,
)
from transactional.sources.stream_ranges import (
    COUNT_BLOCK,
    SCRIPTS,
    Decided,
    StreamRange,
    lost_before,
)
from transactional.spout import (
    PARTITION_COLUMN,
    OpaquePartitionedTransactionalSpout,
    PartitionedTransactionalSpout,
    SpoutContext,
)
from transactional.types import TransactionAttempt

if TYPE_CHECKING:
    import redis
    from pyspark.sql import DataFrame

__all__ = [
    "RECORD_SCHEMA",
    "RedisStreamsOpaqueSpout",
    "RedisStreamsPartitionedSpout",
    "StreamRange",
]

StreamStart = Literal["earliest", "latest"] | Mapping[str, str] | datetime


class _Streams(SourceBase):
    """The streams, seen from the driver."""

    #: An entry's place (a gap's row has no id, and is one per stream): its ledger id
    #: (``transactional.ledger``).
    position_columns: ClassVar[tuple[str, ...]] = ("stream", "id")

    def __init__(
        self,
        url: str,
        streams: Sequence[str],
        batch_size: int = 10_000,
        start: StreamStart = "earliest",
        value_field: str | None = None,
    ) -> None:
        super().__init__(batch_size)
        who = type(self).__name__
        if isinstance(streams, str) or not streams:
            raise ConfigurationError(
                f"{who}: streams must be a list of stream keys (one partition each), not "
                f"{streams!r}"
            )
        if len(set(streams)) != len(streams):
            raise ConfigurationError(f"{who}: a stream is named twice in {list(streams)}")
        self.streams = list(streams)
        self.start = start
        self._check_start()
        self.url = url
        self.value_field = value_field
        self._client: redis.Redis | None = None
        self._scripts: dict[str, Any] = {}
        #: Each stream's last id and entries-added count at open (``start="latest"``).
        self._latest: dict[str, tuple[str, int]] = {}
        #: Per partition, entries the stream was given beyond the last range decided.
        self._behind: dict[int, int] = {}
        self._fresh = False

    @property
    def who(self) -> str:
        return type(self).__name__

    def _check_start(self) -> None:
        who, start, streams = self.who, self.start, self.streams
        if isinstance(start, str) and start not in ("earliest", "latest"):
            raise ConfigurationError(
                f"{who}: start must be 'earliest', 'latest', a mapping of stream to entry "
                f"id or a datetime, not {start!r}"
            )
        if isinstance(start, Mapping):
            unknown = sorted(set(start) - set(streams))
            if unknown:
                raise ConfigurationError(
                    f"{who}: start names {', '.join(map(repr, unknown))}, which "
                    f"{'is' if len(unknown) == 1 else 'are'} not among the streams {list(streams)}"
                )
            for stream, entry in start.items():
                try:
                    parse_id(entry)
                except ValueError:
                    raise ConfigurationError(
                        f"{who}: start id {entry!r} of stream {stream!r} is not an entry id "
                        "(like '1700000000000-0')"
                    ) from None

    def identity(self) -> str:
        return f"{type(self).__module__}.{type(self).__qualname__}:{','.join(self.streams)}"

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(
                self.url, socket_connect_timeout=5, socket_timeout=30
            )
            self._scripts = {
                name: self._client.register_script(script) for name, script in SCRIPTS.items()
            }
        return self._client

    def preflight(self) -> None:
        """One PING, with a few seconds to connect."""
        import redis

        timeout = SECONDS
        client = redis.Redis.from_url(
            self.url, socket_connect_timeout=timeout, socket_timeout=timeout
        )
        try:
            check_redis(client, self.url)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{self.who}: {exc}") from None

    def open(self, context: SpoutContext) -> None:
        super().open(context)
        import redis

        self.start_from(lambda text: parse_start(text, self.who, key=str, value=str))
        self._check_start()

        try:
            version = str(self.client.info("server").get("redis_version", "0"))
            pipe = self.client.pipeline(transaction=False)
            for stream in self.streams:
                pipe.type(stream)
            kinds = [k.decode() if isinstance(k, bytes) else k for k in pipe.execute()]
        except redis.RedisError as e:
            raise ConfigurationError(
                f"{self.who}: cannot reach Redis at {redact_url(self.url)} ({e}): start "
                "redis-server or fix the URL"
            ) from e
        if int(version.split(".")[0]) < 7:
            raise ConfigurationError(
                f"{self.who}: Redis {version} at {redact_url(self.url)} is too old: streams "
                "need Redis 7.0 or later (it says which entries were deleted)"
            )
        wrong = {s: k for s, k in zip(self.streams, kinds, strict=True) if k != "stream"}
        if wrong:
            described = ", ".join(
                f"{s!r} {'does not exist' if k == 'none' else f'is a {k}'}"
                for s, k in wrong.items()
            )
            raise ConfigurationError(
                f"{self.who}: {described} at {redact_url(self.url)}: create each stream "
                "(XADD, or XGROUP CREATE ... MKSTREAM) before the topology starts, or fix "
                "the names"
            )
        infos = {stream: self._info(stream) for stream in self.streams}
        self._latest = {
            stream: (entry_id(info["last-generated-id"]), int(info["entries-added"]))
            for stream, info in infos.items()
        }

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def num_partitions(self) -> int:
        return len(self.streams)

    # -- deciding ranges ------------------------------------------------------------

    def _info(self, stream: str) -> dict[str, Any]:
        import redis

        try:
            return dict(self.client.xinfo_stream(stream))
        except redis.ResponseError as e:
            raise EmitError(f"{self.who}: stream {stream!r} is gone ({e})") from e

    def starting(self, partition: int) -> tuple[str, int]:
        """Where a stream without a range starts: the exclusive bound, and how many
        entries the stream had been given up to it (those deleted after it before the
        start are not counted: the topology starts from what the stream holds)."""
        stream, start = self.streams[partition], self.start
        if not self._fresh or start == "earliest":
            return "0-0", 0
        if start == "latest":
            return self._latest[stream]
        if isinstance(start, datetime):
            bound = before(f"{ceil_millis(start)}-0")
        elif stream in start:
            bound = before(start[stream])
        else:
            return "0-0", 0
        added = int(self._info(stream)["entries-added"])
        return bound, max(0, added - self._held_after(stream, bound))

    def is_ready(self, txid: int, last_metas: Mapping[int, StreamRange]) -> bool:
        self._fresh = not last_metas
        pipe = self.client.pipeline(transaction=False)
        for stream in self.streams:
            pipe.xinfo_stream(stream)
        ready = False
        for p, info in enumerate(pipe.execute()):
            last = last_metas.get(p)
            after, position = (last.last, last.position) if last else self.starting(p)
            self._behind[p] = max(0, int(info["entries-added"]) - position)
            ready = ready or parse_id(entry_id(info["last-generated-id"])) > parse_id(after)
        return ready

    def lag(self) -> int | None:
        """Entries the streams were given beyond the last txid's ranges, at the last look."""
        behind = self._behind
        return sum(behind.values()) if behind else None

    def next_range(self, partition: int, last: StreamRange | None) -> StreamRange:
        """The range after ``last``, and what was lost before it: entries trimmed
        (counted: the stream had been given more entries before its first one than
        ``last`` read) or deleted by ``XDEL`` (``max-deleted-entry-id``) before they
        were read."""
        stream = self.streams[partition]
        after, position = (last.last, last.position) if last else self.starting(partition)
        wanted = self.next_batch_size()
        self.client  # noqa: B018 - registers the scripts
        d = Decided.of(self._scripts["decide"](keys=[stream], args=[after, wanted]))
        lost, note = lost_before(stream, after, position, wanted, d)
        last_id = d.end or after
        if lost == -1:
            now = max(0, d.added - self._held_after(stream, last_id))
        else:
            now = position + lost + d.count
        self._behind[partition] = max(0, d.added - now)
        return StreamRange(
            after=after, last=last_id, count=d.count, position=now, lost=lost, lost_note=note
        )

    def _next(self, stream: str, after: str, n: int) -> tuple[int, str | None, str | None]:
        self.client  # noqa: B018 - registers the scripts
        count, first, last = self._scripts["next"](keys=[stream], args=[after, n])
        decoded = [v.decode() if isinstance(v, bytes) else v for v in (first, last)]
        return int(count), decoded[0] or None, decoded[1] or None

    def _held_after(self, stream: str, bound: str) -> int:
        """Entries the stream holds after ``bound``, counted inside Redis a block at a
        time (no script runs long enough to stall it)."""
        total, at = 0, bound
        while True:
            count, _first, last = self._next(stream, at, COUNT_BLOCK)
            total += count
            if count < COUNT_BLOCK or last is None:
                return total
            at = last

    def check_held(self, attempt: TransactionAttempt, ranges: Mapping[int, StreamRange]) -> None:
        """A replayable range must still hold all its entries: say which does not,
        instead of giving fewer records."""
        self.client  # noqa: B018 - registers the scripts
        for p, r in ranges.items():
            if not r.count:
                continue
            held = int(self._scripts["count"](keys=[self.streams[p]], args=[r.after, r.last]))
            if held != r.count:
                raise SourceDataLostError(
                    f"{self.who}: txid {attempt.txid} reads the {r.count} entries of stream "
                    f"{self.streams[p]!r} after {r.after} up to {r.last}, but the stream now "
                    f"holds {held} of them: they were trimmed or deleted before the txid "
                    "committed, so it cannot be replayed exactly. Trim only what a committed "
                    "txid has read, or use RedisStreamsOpaqueSpout with an opaque committer"
                )

    # -- reading --------------------------------------------------------------------

    def read(self, ranges: Mapping[int, StreamRange], tagged: bool = False) -> DataFrame:
        """The records of ``ranges`` (partition -> range) as one frame, a Spark task per
        range (a range's entries are found from its first id on, so it is read by one
        reader); ``tagged``: with each row's partition in ``PARTITION_COLUMN``."""
        rows = [
            (self.url, self.streams[p], r.after, r.last, r.count, self.value_field or "", p)
            for p, r in sorted(ranges.items())
            if r.count
        ]
        if not tagged:
            rows = [(*row[:-1], -1) for row in rows]
        output = RECORD_SCHEMA + (f", {PARTITION_COLUMN} INT" if tagged else "")
        frame = split_frame(self.spark, rows, SPLIT_SCHEMA, read_stream_splits, None, output)
        gaps = [
            self._gap(r.lost_note, self.streams[p], p if tagged else None)
            for p, r in sorted(ranges.items())
            if r.lost_note is not None
        ]
        if gaps:
            frame = frame.unionByName(self.spark.createDataFrame(gaps, output))
        return frame

    def _gap(self, note: str, stream: str, partition: int | None) -> tuple[Any, ...]:
        """The row that stands for entries lost before they were read."""
        row = (stream, None, None, None, f"{note}; the batch goes on from the next entry held")
        return row if partition is None else (*row, partition)


class RedisStreamsPartitionedSpout(_Streams, PartitionedTransactionalSpout[StreamRange]):
    """Each stream a partition, ``batch_size`` entries per stream per txid, replayed
    exactly from the stored ranges."""

    metadata_type = StreamRange

    def emit_partition_batch_new(
        self, attempt: TransactionAttempt, partition: int, last_meta: StreamRange | None
    ) -> StreamRange:
        meta = self.next_range(partition, last_meta)
        if meta.lost_note is not None:
            raise SourceDataLostError(
                f"{self.who}: {meta.lost_note}. Trim only what a committed txid has read, "
                "or use RedisStreamsOpaqueSpout with an opaque committer"
            )
        return meta

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, meta: StreamRange
    ) -> DataFrame:
        self.check_held(attempt, {partition: meta})
        return self.read({partition: meta})

    def emit_partitions(
        self, attempt: TransactionAttempt, metas: Mapping[int, StreamRange]
    ) -> DataFrame:
        self.check_held(attempt, metas)
        return self.read(metas, tagged=True)


class RedisStreamsOpaqueSpout(_Streams, OpaquePartitionedTransactionalSpout[StreamRange]):
    """Each stream a partition, for opaque committers: a batch starts after the last
    committed one; entries deleted before they were read are named by a row of the
    batch (``error``), and the batch goes on from the first entry still held."""

    metadata_type = StreamRange

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, last_meta: StreamRange | None
    ) -> tuple[StreamRange, DataFrame]:
        meta = self.next_range(partition, last_meta)
        return meta, self.read({partition: meta})
