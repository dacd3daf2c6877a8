"""The bookkeeping of a Redis Streams spout's ranges: what a range is (``StreamRange``),
the scripts that decide and check one inside Redis (reading the stream, or, in the
consumer-group mode, through the group: ``DECIDE_GROUP``), and how entries lost before
they were read are counted (``lost_before``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from transactional.sources.redis_streams._entries import entry_id, parse_id
from transactional.types import BatchMetadata

__all__ = ["COUNT_BLOCK", "DECIDE_GROUP", "SCRIPTS", "Decided", "StreamRange", "lost_before"]

#: The next ``ARGV[2]`` entries after ``ARGV[1]`` (exclusive): their count, first and
#: last ids, read inside Redis so that only three values cross the network.
NEXT = """
local entries = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])
local n = #entries
if n == 0 then return {0, false, false} end
return {n, entries[1][1], entries[n][1]}
"""
#: The stream's counts as ``XINFO STREAM`` says them now (``added``, ``length``,
#: ``deleted``, ``first``): the opening of both deciding scripts.
COUNTS = """
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local added, length, deleted, first = 0, 0, '0-0', false
for i = 1, #info, 2 do
  local k, v = info[i], info[i + 1]
  if k == 'entries-added' then added = v
  elseif k == 'length' then length = v
  elseif k == 'max-deleted-entry-id' then deleted = v
  elseif k == 'first-entry' and v then first = v[1] end
end
"""
#: A new range and the stream's counts in one atomic step: what ``NEXT`` returns,
#: then ``entries-added``, ``length``, ``max-deleted-entry-id`` and the first entry's id
#: (false: none) as ``XINFO STREAM`` says at that moment, so that no trim can fall
#: between the counts a loss is judged by and the range they judge.
DECIDE = (
    COUNTS
    + """local entries = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])
local n = #entries
local last = false
if n > 0 then last = entries[n][1] end
return {n, last, added, length, deleted, first}
"""
)
#: ``DECIDE`` through the consumer group ``ARGV[3]``, as consumer ``ARGV[4]``: the range
#: after ``ARGV[1]`` (the end of the stored ranges) takes first the entries the group
#: delivered there already and no stored range holds (a runner died, or its store write
#: failed, between its ``XREADGROUP`` and storing the range; or a reply was lost), then
#: new ones (``XREADGROUP ... >``) up to ``ARGV[2]`` in all. A group behind ``ARGV[1]``
#: (recreated, or reset by ``XGROUP SETID``) is moved to it first, and a group destroyed
#: while the topology runs is created again there: what a stored range holds is never
#: delivered again. Replies as ``DECIDE``, then how many entries the
#: ``XREADGROUP`` delivered. Ids are compared as decimal strings: Lua's numbers are
#: doubles, and an id's parts are 64-bit.
DECIDE_GROUP = (
    """
local function parts(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if ms then return ms, seq end
  return id, '0'
end
local function below(a, b)
  local am, as = parts(a)
  local bm, bs = parts(b)
  if #am ~= #bm then return #am < #bm end
  if am ~= bm then return am < bm end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end
"""
    + COUNTS
    + """local delivered = false
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, last = nil, nil
  for i = 1, #group, 2 do
    if group[i] == 'name' then name = group[i + 1]
    elseif group[i] == 'last-delivered-id' then last = group[i + 1] end
  end
  if name == ARGV[3] then delivered = last end
end
local after, wanted = ARGV[1], tonumber(ARGV[2])
if not delivered then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[3], after)
  delivered = after
end
local n, last = 0, false
if below(after, delivered) then
  local held = redis.call('XRANGE', KEYS[1], '(' .. after, delivered, 'COUNT', wanted)
  n = #held
  if n > 0 then last = held[n][1] end
elseif below(delivered, after) then
  redis.call('XGROUP', 'SETID', KEYS[1], ARGV[3], after)
end
local fresh = 0
if n < wanted then
  local reply = redis.call('XREADGROUP', 'GROUP', ARGV[3], ARGV[4], 'COUNT', wanted - n,
    'STREAMS', KEYS[1], '>')
  if reply then
    local entries = reply[1][2]
    fresh = #entries
    if fresh > 0 then
      n = n + fresh
      last = entries[fresh][1]
    end
  end
end
return {n, last, added, length, deleted, first, fresh}
"""
)
#: Entries counted per script call when counting a stream's tail.
COUNT_BLOCK = 100_000
#: How many entries ``(ARGV[1], ARGV[2]]`` holds now.
COUNT = """
if ARGV[1] == ARGV[2] then return 0 end
return #redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], ARGV[2])
"""


class StreamRange(BatchMetadata):
    """The ``count`` entries of one stream after id ``after`` up to id ``last``
    (``last == after`` for an empty range); ``position``: how many entries the stream
    had ever been given up to ``last`` (Redis's ``entries-added`` count at that id), by
    which entries trimmed before they were read are counted. ``lost`` (opaque spout
    only): entries lost before this range, -1 when Redis cannot tell how many (an
    ``XDEL``); ``lost_note`` says which."""

    after: str
    last: str
    count: int = Field(ge=0)
    position: int = Field(default=0, ge=0)
    lost: int = Field(default=0, ge=-1)
    lost_note: str | None = None


#: The scripts a spout registers, by name.
SCRIPTS = {"next": NEXT, "decide": DECIDE, "decide_group": DECIDE_GROUP, "count": COUNT}


@dataclass(frozen=True)
class Decided:
    """``DECIDE``'s reply: the next range (``count`` entries up to id ``end``, None:
    none) and the stream's counts at that moment (``XINFO STREAM``: ``entries-added``,
    ``length``, ``max-deleted-entry-id``, the first entry's id, None: empty)."""

    count: int
    end: str | None
    added: int
    length: int
    deleted: str
    first: str | None

    @classmethod
    def of(cls, reply: list[Any]) -> Decided:
        count, end, added, length, deleted, first = reply[:6]
        return cls(
            count=int(count),
            end=entry_id(end) if end else None,
            added=int(added),
            length=int(length),
            deleted=entry_id(deleted),
            first=entry_id(first) if first else None,
        )


def lost_before(
    stream: str, after: str, position: int, wanted: int, d: Decided
) -> tuple[int, str | None]:
    """Entries of ``stream`` lost after id ``after`` before they were read, and what
    to tell of it, given the range decided after it (``d``, of ``wanted`` entries) and
    ``position``, how many entries the stream had been given up to ``after``: deleted
    by ``XDEL`` (``max-deleted-entry-id`` beyond ``after`` and not beyond the range: -1,
    Redis cannot tell how many), or trimmed (the stream's first entry is beyond
    ``after`` and it had been given more entries before it than ``position``: that
    many); else 0."""
    lost, note = 0, None
    if parse_id(d.deleted) > parse_id(after) and (
        d.count < wanted or d.end is None or parse_id(d.deleted) <= parse_id(d.end)
    ):
        lost = -1
        note = (
            f"entries of stream {stream!r} after {after} were deleted (XDEL) before "
            f"they were read, the last of them {d.deleted}"
        )
    elif (d.first is None or parse_id(d.first) > parse_id(after)) and (
        d.added - d.length > position
    ):
        lost = d.added - d.length - position
        note = (
            f"{lost} entries of stream {stream!r} after {after} were trimmed before they were read"
        )
    return lost, note
