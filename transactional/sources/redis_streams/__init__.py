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

from transactional.sources.redis_streams._spouts import (
    MAX_BLOCK_MS,
    RedisStreamsOpaqueSpout,
    RedisStreamsPartitionedSpout,
)

__all__ = ["MAX_BLOCK_MS", "RedisStreamsOpaqueSpout", "RedisStreamsPartitionedSpout"]
