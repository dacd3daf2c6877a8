"""The consumer group of a Redis Streams spout (``group=``), seen from the driver: created
at open where the topology starts, owned by the topology alone, its entries a dead
runner left pending claimed by the next one, and the entries of finished txids
acknowledged (``XACK``) in bulk inside Redis.

The group never decides what a txid holds: the stored ranges do (``stream_ranges``). It
is how the source tells Redis, and whoever watches the group (``XPENDING``, ``XINFO
GROUPS``), which entries the topology has taken and which it is done with.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from transactional.errors import ConfigurationError
from transactional.secrets import redact_url
from transactional.sources.redis_streams._entries import entry_id

if TYPE_CHECKING:
    import redis

__all__ = ["ACK_BLOCK", "CLAIM_BLOCK", "ConsumerGroup", "consumer_name"]

#: Entries acknowledged per script call (each id is an argument of one ``XACK``: Lua's
#: stack holds a few thousand).
ACK_BLOCK = 4_000
#: Entries claimed per script call.
CLAIM_BLOCK = 10_000

#: The group's pending entries in ``[ARGV[2], ARGV[3]]`` (``(id``: exclusive; ``-``: from
#: the first), at most ``ARGV[4]`` of them, acknowledged: only their number crosses the
#: network. Replies ``{found, acknowledged}``.
ACK = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
local n = #pending
if n == 0 then return {0, 0} end
local ids = {}
for i = 1, n do ids[i] = pending[i][1] end
return {n, redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))}
"""
#: Every pending entry of the group from cursor ``ARGV[3]`` on, up to ``ARGV[4]`` of
#: them, claimed by consumer ``ARGV[2]`` whatever their idle time (``JUSTID``: their
#: delivery counts are left alone). Replies ``{next cursor, claimed}``; cursor ``0-0``:
#: done.
CLAIM = """
local reply = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'COUNT',
  ARGV[4], 'JUSTID')
return {reply[1], #reply[2]}
"""

_opened = itertools.count(1)


def consumer_name(topology_id: str) -> str:
    """This runner's consumer: the topology's id, then where it runs and which of this
    process's spouts it is (``events:host-a:4242:1``), so that ``XINFO CONSUMERS`` tells
    runners apart and the topology's consumers by their prefix."""
    return f"{topology_id}:{socket.gethostname()}:{os.getpid()}:{next(_opened)}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ConsumerGroup:
    """The group ``name`` on each of ``streams``, read as ``consumer`` of topology
    ``topology_id``. All its commands are safe to repeat (redis-py may retry one after a
    lost connection): creating an existing group, claiming what is claimed, and
    acknowledging what is acknowledged change nothing."""

    def __init__(
        self,
        client: redis.Redis,
        who: str,
        url: str,
        streams: Sequence[str],
        name: str,
        topology_id: str,
    ) -> None:
        self.client, self.who, self.url, self.name = client, who, url, name
        self.streams = list(streams)
        self.topology_id = topology_id
        self.consumer = consumer_name(topology_id)
        self._ack = client.register_script(ACK)
        self._claim = client.register_script(CLAIM)

    def owns(self, consumer: str) -> bool:
        """Whether ``consumer`` is one of this topology's (a runner's, alive or dead)."""
        return consumer.startswith(f"{self.topology_id}:")

    def open(self, starts: Mapping[str, str]) -> dict[str, int]:
        """Create the group where missing, at ``starts[stream]`` for each stream (an
        exclusive id, or ``$``), with the stream if it does not exist (``MKSTREAM``); refuse a group that
        other consumers read; claim every entry the group holds pending, and remove the
        topology's consumers left with none (dead runners'). Returns, per stream, how
        many entries were claimed."""
        import redis

        for stream in self.streams:
            start = starts[stream]
            try:
                self.client.xgroup_create(stream, self.name, id=start, mkstream=True)
            except redis.ResponseError as e:
                if not str(e).startswith("BUSYGROUP"):
                    raise ConfigurationError(
                        f"{self.who}: cannot create the consumer group {self.name!r} of "
                        f"stream {stream!r} at {redact_url(self.url)} ({e})"
                    ) from e
        consumers = self._consumers()
        for stream, names in consumers.items():
            foreign = sorted(c for c in names if not self.owns(c))
            if foreign:
                raise ConfigurationError(
                    f"{self.who}: the consumer group {self.name!r} of stream {stream!r} is "
                    f"read by {', '.join(map(repr, foreign))}, which "
                    f"{'is' if len(foreign) == 1 else 'are'} not topology "
                    f"{self.topology_id!r}'s: a topology's ranges are all the group's "
                    "entries in order, so it must own its group. Give group= a name no one "
                    f"else reads, or remove them (XGROUP DELCONSUMER {stream} {self.name} "
                    "NAME) if they are gone"
                )
        claimed = {stream: self._claim_all(stream) for stream in self.streams}
        self._forget(lambda consumer: consumer != self.consumer and self.owns(consumer))
        return claimed

    def _consumers(self) -> dict[str, dict[str, int]]:
        """Per stream, each consumer of the group and how many entries it holds pending."""
        pipe = self.client.pipeline(transaction=False)
        for stream in self.streams:
            pipe.xinfo_consumers(stream, self.name)
        return {
            stream: {_text(c["name"]): int(c["pending"]) for c in replies}
            for stream, replies in zip(self.streams, pipe.execute(), strict=True)
        }

    def _claim_all(self, stream: str) -> int:
        cursor, total = "0-0", 0
        while True:
            reply = self._claim(keys=[stream], args=[self.name, self.consumer, cursor, CLAIM_BLOCK])
            cursor, total = entry_id(reply[0]), total + int(reply[1])
            if cursor == "0-0":
                return total

    def _forget(self, which: Callable[[str], bool]) -> None:
        """Remove the consumers ``which`` picks that hold nothing pending: a consumer
        that does is left, for its entries stay visible under it."""
        pipe = self.client.pipeline(transaction=False)
        gone = 0
        for stream, consumers in self._consumers().items():
            for consumer, pending in consumers.items():
                if which(consumer) and pending == 0:
                    pipe.xgroup_delconsumer(stream, self.name, consumer)
                    gone += 1
        if gone:
            pipe.execute()

    def acknowledge(self, bounds: Mapping[str, tuple[str, str]]) -> int:
        """``XACK`` every pending entry of each stream between its bounds (``(low, high)``,
        as ``XPENDING`` takes them), in blocks, the streams' scripts pipelined. Returns
        how many entries were acknowledged."""
        todo = {s: b for s, b in bounds.items() if b[1] != "0-0"}
        total = 0
        while todo:
            pipe = self.client.pipeline(transaction=False)
            streams = list(todo)
            for stream in streams:
                low, high = todo[stream]
                self._ack(keys=[stream], args=[self.name, low, high, ACK_BLOCK], client=pipe)
            for stream, (found, acked) in zip(streams, pipe.execute(), strict=True):
                total += int(acked)
                if int(found) < ACK_BLOCK:
                    del todo[stream]
        return total

    def leave(self) -> None:
        """Remove this runner's consumer if it holds nothing pending (a clean stop), so
        that ``XINFO CONSUMERS`` lists only runners that have entries in their hands (the
        dead runners' consumers go at the next open, once claimed)."""
        self._forget(lambda consumer: consumer == self.consumer)
