"""The Redis Streams spouts (``transactional.sources.redis_streams`` says what they promise)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from transactional.errors import ConfigurationError, EmitError, SourceDataLostError
from transactional.lineage import Dataset, in_redis
from transactional.preflight import SECONDS, check_redis
from transactional.secrets import redact_url
from transactional.sources.base import HeldRanges, SourceBase, parse_start, split_frame
from transactional.sources.redis_streams._entries import (
    CONNECT_TIMEOUT,
    RECORD_SCHEMA,
    SOCKET_TIMEOUT,
    SPLIT_SCHEMA,
    before,
    ceil_millis,
    entry_id,
    parse_id,
    read_stream_splits,
)
from transactional.sources.redis_streams._groups import ConsumerGroup
from transactional.sources.redis_streams._ranges import (
    COUNT_BLOCK,
    SCRIPTS,
    Decided,
    StreamRange,
    lost_before,
)
from transactional.spout import (
    PARTITION_COLUMN,
    OpaquePartitionedTransactionalSpout,
    SpoutContext,
)
from transactional.types import TransactionAttempt

if TYPE_CHECKING:
    import redis
    from pyspark.sql import DataFrame

__all__ = [
    "MAX_BLOCK_MS",
    "RECORD_SCHEMA",
    "SOCKET_TIMEOUT",
    "RedisStreamsOpaqueSpout",
    "RedisStreamsPartitionedSpout",
    "StreamRange",
]

StreamStart = Literal["earliest", "latest"] | Mapping[str, str] | datetime

#: The longest ``block_ms``: ``is_ready`` holds the runner's coordinator thread.
MAX_BLOCK_MS = 10_000


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
        group: str | None = None,
        block_ms: int = 0,
    ) -> None:
        super().__init__(batch_size)
        who = type(self).__name__
        if group is not None and (not isinstance(group, str) or not group.strip()):
            raise ConfigurationError(
                f"{who}: group must be the name of a consumer group (or None: no group), "
                f"not {group!r}"
            )
        if isinstance(block_ms, bool) or not isinstance(block_ms, int):
            raise ConfigurationError(
                f"{who}: block_ms must be a whole number of milliseconds, not {block_ms!r}"
            )
        if not 0 <= block_ms <= MAX_BLOCK_MS:
            raise ConfigurationError(
                f"{who}: block_ms={block_ms}: give 0 (never wait) up to {MAX_BLOCK_MS} "
                "(is_ready holds the runner's coordinator thread while it waits)"
            )
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
        self.group = group
        self.block_ms = block_ms
        self._group: ConsumerGroup | None = None
        #: Every txid below this one is done (``cleanup_before``).
        self._done_below = 0
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
        return f"{self.stored_name}:{','.join(self.streams)}"

    def lineage_datasets(self) -> Sequence[Dataset]:
        return tuple(in_redis(self.url, stream) for stream in self.streams)

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(
                self.url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=SOCKET_TIMEOUT
            )
            self._scripts = {
                name: self._client.register_script(script) for name, script in SCRIPTS.items()
            }
        return self._client

    def preflight(self) -> None:
        """One PING, with a few seconds to connect, not retried (redis-py's retries
        would only repeat the same answer)."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        timeout = SECONDS
        client = redis.Redis.from_url(
            self.url,
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
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
        # The consumer-group mode creates a missing stream with its group.
        fine = ("stream", "none") if self.group is not None else ("stream",)
        wrong = {s: k for s, k in zip(self.streams, kinds, strict=True) if k not in fine}
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
        self._check_block()
        if self.group is not None:
            self._group = ConsumerGroup(
                self.client, self.who, self.url, self.streams, self.group, context.topology_id
            )
            try:
                self._group.open({stream: self._group_start(stream) for stream in self.streams})
            except redis.RedisError as e:
                raise ConfigurationError(
                    f"{self.who}: cannot open the consumer group {self.group!r} at "
                    f"{redact_url(self.url)} ({e})"
                ) from e
        infos = {stream: self._info(stream) for stream in self.streams}
        self._latest = {
            stream: (entry_id(info["last-generated-id"]), int(info["entries-added"]))
            for stream, info in infos.items()
        }

    def _check_block(self) -> None:
        """A blocking read must end before the client gives up on its reply: refuse a
        URL whose ``socket_timeout`` is no longer than the block."""
        if not self.block_ms:
            return
        timeout = self.client.connection_pool.connection_kwargs.get("socket_timeout")
        if timeout is not None and float(timeout) * 1000 <= self.block_ms:
            raise ConfigurationError(
                f"{self.who}: block_ms={self.block_ms} waits at least as long as the "
                f"client's socket_timeout ({timeout} s, set in the URL "
                f"{redact_url(self.url)}), which would end the wait with a TimeoutError: "
                "lower block_ms or raise socket_timeout"
            )

    def _group_start(self, stream: str) -> str:
        """Where a group created now starts on ``stream``: the topology's start, as an
        exclusive id (``$``: the stream's end)."""
        start = self.start
        if start == "latest":
            return "$"
        if isinstance(start, datetime):
            return before(f"{ceil_millis(start)}-0")
        if isinstance(start, Mapping) and stream in start:
            return before(start[stream])
        return "0-0"

    def close(self) -> None:
        if self._group is not None:
            import redis

            # A consumer left behind is removed by the next open.
            with contextlib.suppress(redis.RedisError):
                self._group.leave()
            self._group = None
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
        ends: dict[Any, Any] = {}
        for p, info in enumerate(pipe.execute()):
            last = last_metas.get(p)
            after, position = (last.last, last.position) if last else self.starting(p)
            ends[self.streams[p]] = after
            self._behind[p] = max(0, int(info["entries-added"]) - position)
            ready = ready or parse_id(entry_id(info["last-generated-id"])) > parse_id(after)
        if not ready and self.block_ms:
            # Waits without taking anything: the range is decided as ever, after it.
            ready = bool(self.client.xread(ends, count=1, block=self.block_ms))
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
        if self._group is None:
            reply = self._scripts["decide"](keys=[stream], args=[after, wanted])
        else:
            reply = self._decide_group(stream, after, wanted)
        d = Decided.of(reply)
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

    def _decide_group(self, stream: str, after: str, wanted: int) -> Any:
        import redis

        assert self._group is not None
        group, consumer = self._group.name, self._group.consumer
        try:
            return self._scripts["decide_group"](
                keys=[stream], args=[after, wanted, group, consumer]
            )
        except redis.ResponseError as e:
            raise EmitError(f"{self.who}: stream {stream!r}: {e}") from e

    # -- the group's hooks ----------------------------------------------------------

    def cleanup_before(self, txid: int) -> None:
        self._done_below = max(self._done_below, txid)

    def ack(self, txid: int, meta: Any) -> None:
        """``XACK`` the txid's entries (consumer-group mode; else nothing): every pending
        entry up to each range's end when every txid below is done too, else the
        range's own."""
        if self._group is None:
            return
        through = txid <= self._done_below
        bounds: dict[str, tuple[str, str]] = {}
        for p, value in dict(meta).items():
            r = StreamRange.model_validate(value)
            if through:
                bounds[self.streams[int(p)]] = ("-", r.last)
            elif r.count:
                bounds[self.streams[int(p)]] = (f"({r.after}", r.last)
        self._group.acknowledge(bounds)

    def fail(self, txid: int, meta: Any) -> None:
        """Nothing to tell Redis: the txid is emitted again from its stored ranges (the
        opaque spout: from the last committed ones), whose entries the group delivered
        already and keeps pending until they are acknowledged."""

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


class RedisStreamsPartitionedSpout(_Streams, HeldRanges[StreamRange]):
    """Each stream a partition, ``batch_size`` entries per stream per txid, replayed
    exactly from the stored ranges; ``group=``: read through that consumer group, each
    committed txid's entries acknowledged (the module's docstring says when)."""

    #: What stores hold for this class (``identity``); never changes.
    stored_name = "transactional.sources.redis_streams.RedisStreamsPartitionedSpout"

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


class RedisStreamsOpaqueSpout(_Streams, OpaquePartitionedTransactionalSpout[StreamRange]):
    """Each stream a partition, for opaque committers: a batch starts after the last
    committed one; entries deleted before they were read are named by a row of the
    batch (``error``), and the batch goes on from the first entry still held;
    ``group=`` as for the partitioned spout."""

    #: What stores hold for this class (``identity``); never changes.
    stored_name = "transactional.sources.redis_streams.RedisStreamsOpaqueSpout"

    metadata_type = StreamRange

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, last_meta: StreamRange | None
    ) -> tuple[StreamRange, DataFrame]:
        meta = self.next_range(partition, last_meta)
        return meta, self.read({partition: meta})
