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

``block_ms=`` (0, the default: never): how long ``is_ready`` waits for an entry when no
stream has one beyond the last txid (``XREAD BLOCK``), rather than answering no at once
and leaving the runner to poll again; it holds the runner's coordinator thread while it
waits, so it is bounded (``MAX_BLOCK_MS``). The client's ``socket_timeout`` is the
source's own (30 s, ``SOCKET_TIMEOUT``), not redis-py's: redis-py 8 cut the default from
none to 5 s, which would end a longer blocking read with ``TimeoutError``; a URL that
sets a ``socket_timeout`` no longer than the block is refused at open.

The consumer-group mode (``group="name"``): the streams are read through the consumer
group ``name`` (``XREADGROUP``), so that Redis, and whoever watches the group
(``XPENDING``, ``XINFO GROUPS``), knows which entries the topology has taken and which it
is done with. Exactness never depends on the group: a txid's metadata is still an id
range per stream, replayed by ``XRANGE``. The rules:

- At open the group is created where missing (``XGROUP CREATE ... MKSTREAM``: a missing
  stream is created too) at the topology's start (``start=``, ``--start-from``). The
  group must be the topology's own: a consumer of it that is not the topology's (the
  topology id, then ``:``) is refused. This runner reads as consumer
  ``<topology id>:<host>:<pid>:<n>``.
- A new txid's range on a stream starts where the stored ranges end (A), as without a
  group. It takes first the entries the group delivered beyond A already (a runner that
  read them and died, or failed to store, before its txid's metadata was stored: no
  txid holds them, so none counted them), then delivers new ones with ``XREADGROUP``,
  ``batch_size`` in all, in one script. A group behind A (recreated, or moved back by
  ``XGROUP SETID``) is moved to A first, and one destroyed while the topology runs is
  created again at A: entries a stored range holds are never delivered again.
- ``ack(txid)``, once the txid is committed everywhere and the store has advanced past
  it: its entries are acknowledged (``XACK``) inside Redis, found with ``XPENDING``
  between the range's bounds (the ids never cross the network), in blocks, the streams
  pipelined. When every txid below it is done too (``cleanup_before`` said so just
  before, as the runner does after a commit), every pending entry up to the range's
  end is acknowledged, not only the range's: what an earlier runner committed and died
  before acknowledging goes with it. An ``ack`` without that (a txid dropped under
  at-most-once while earlier ones are in flight) acknowledges its own ranges only.
- ``fail(txid)`` does nothing to Redis: the txid is replayed from its stored ranges.

What a killed runner leaves, and what the next one does with it:

- killed between its ``XREADGROUP`` and storing the txid's metadata: the delivered
  entries are pending and no stored range holds them; the next new txid takes them
  first (above), so they are counted once.
- killed after the metadata was stored, before the commit: the txid replays from its
  ranges; its entries stay pending until it commits and is acknowledged.
- killed after the commit and the store's advance, before ``XACK``
  (``FaultPoint.AFTER_ADVANCE``): the entries are pending but every new range starts
  after them, so they are never counted again; they are acknowledged with the next
  txid a runner commits (until then ``XPENDING`` shows them).
- at open, the next runner claims every entry the group holds pending (``XAUTOCLAIM``,
  whatever its idle time: only the leader opens the spout), so that ``XPENDING`` names a
  live consumer, and removes the consumers of dead runners once they hold nothing.

Entries the group holds pending before where a new topology starts are acknowledged
with its first committed txid: the topology will never read them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from transactional.errors import ConfigurationError, EmitError, SourceDataLostError
from transactional.preflight import SECONDS, check_redis
from transactional.secrets import redact_url
from transactional.sources.base import SourceBase, parse_start, split_frame
from transactional.sources.stream_entries import (
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
from transactional.sources.stream_groups import ConsumerGroup
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
        return f"{type(self).__module__}.{type(self).__qualname__}:{','.join(self.streams)}"

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


class RedisStreamsPartitionedSpout(_Streams, PartitionedTransactionalSpout[StreamRange]):
    """Each stream a partition, ``batch_size`` entries per stream per txid, replayed
    exactly from the stored ranges; ``group=``: read through that consumer group, each
    committed txid's entries acknowledged (the module's docstring says when)."""

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
    batch (``error``), and the batch goes on from the first entry still held;
    ``group=`` as for the partitioned spout."""

    metadata_type = StreamRange

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, last_meta: StreamRange | None
    ) -> tuple[StreamRange, DataFrame]:
        meta = self.next_range(partition, last_meta)
        return meta, self.read({partition: meta})
