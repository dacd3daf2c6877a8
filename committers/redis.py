"""Counters and dead letters in Redis, each commit one atomic Lua script."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from committers.base import CounterCommitter, CounterTable
from transactional.committer import CommitterContext
from transactional.errors import CommitError, ConfigurationError, FencedError
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

if TYPE_CHECKING:
    import redis
    from pyspark.sql import DataFrame

#: Undo-log value meaning "the field did not exist before this txid". Counts are integer
#: strings, so an empty string can never be a real previous value.
ABSENT = ""

#: Keys: 1 txid, 2 undo log, 3 undo dead-letter count, 4 mode, 5 dead-letter list,
#: 6 fence, 7.. the counter hashes. Every check comes before the first write, because
#: Redis does not roll a script back when a command fails half-way. The fence is checked
#: first and raised by every commit that passes, a skipped one included: once a new
#: leader has committed anything here, no commit of an earlier leader gets through.
_COMMIT_SCRIPT = """
local batch = cjson.decode(ARGV[1])
local txid = tonumber(batch.txid)
local opaque = batch.mode == 'opaque'
local fence = tonumber(batch.fence)
if fence then
  local held = tonumber(redis.call('GET', KEYS[6]) or '0')
  if fence < held then
    return {'fenced', tostring(held)}
  end
end
local stored_mode = redis.call('GET', KEYS[4])
if stored_mode and stored_mode ~= batch.mode then
  return {'mode', stored_mode}
end
local last = redis.call('GET', KEYS[1])
local last_n = last and tonumber(last)
if last_n and txid <= last_n and not opaque then
  if fence then redis.call('SET', KEYS[6], batch.fence) end
  return {'skipped', last}
end
if last_n and txid < last_n then
  return {'behind', last}
end
for i = 5, #KEYS do
  if i > 6 or (i == 5 and batch.dl) then
    local want = 'hash'
    if i == 5 then want = 'list' end
    local kind = redis.call('TYPE', KEYS[i])['ok']
    if kind ~= 'none' and kind ~= want then
      return {'wrongtype', KEYS[i] .. ' is a ' .. kind .. ', not a ' .. want}
    end
  end
end
local status = 'applied'
if opaque and last_n == txid then
  local n = tonumber(redis.call('GET', KEYS[3]) or '0')
  if n > 0 then
    local tail = redis.call('LRANGE', KEYS[5], -n, -1)
    if #tail ~= n then return {'foreign', KEYS[5]} end
    for _, item in ipairs(tail) do
      local ok, d = pcall(cjson.decode, item)
      if not ok or type(d) ~= 'table' or tonumber(d.txid) ~= txid then
        return {'foreign', KEYS[5]}
      end
    end
  end
  local entries = redis.call('HGETALL', KEYS[2])
  for i = 1, #entries, 2 do
    local k, prev = entries[i], entries[i + 1]
    local sep = string.find(k, '\\0', 1, true)
    local h, f = string.sub(k, 1, sep - 1), string.sub(k, sep + 1)
    if prev == batch.absent then
      redis.call('HDEL', h, f)
    else
      redis.call('HSET', h, f, prev)
    end
  end
  if n > 0 then redis.call('LTRIM', KEYS[5], 0, -n - 1) end
  status = 'reapplied'
end
redis.call('DEL', KEYS[2])
for _, c in ipairs(batch.counters) do
  local h, fs = KEYS[c[1]], c[2]
  for j = 1, #fs, 2 do
    if opaque then
      local prev = redis.call('HGET', h, fs[j])
      redis.call('HSETNX', KEYS[2], h .. '\\0' .. fs[j], prev or batch.absent)
    end
    redis.call('HINCRBY', h, fs[j], fs[j + 1])
  end
end
local pushed = #batch.dead
for i = 1, pushed, 1000 do
  redis.call('RPUSH', KEYS[5], unpack(batch.dead, i, math.min(i + 999, pushed)))
end
if opaque then redis.call('SET', KEYS[3], pushed) end
redis.call('SET', KEYS[1], batch.txid)
redis.call('SET', KEYS[4], batch.mode)
if fence then redis.call('SET', KEYS[6], batch.fence) end
return {status, last or ''}
"""

_INT64 = 2**63


@dataclass(frozen=True)
class RedisBatch:
    """What ``prepare`` hands to ``commit``: plain Python, already summed per field, so
    the serial commit phase does no Spark work at all."""

    txid: int
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    dead_letters: list[str] = field(default_factory=list)


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


def _as_int(value: Any, table: CounterTable) -> int:
    number = int(value)
    if number != value:
        raise CommitError(
            f"counter table {table.name!r}: increment {value!r} in column {table.value!r} is "
            "not an integer; Redis counters are integers (HINCRBY)"
        )
    return number


class RedisCommitter(CounterCommitter):
    """Adds counter increments into Redis hashes and appends dead letters to a list.

    Layout: hash ``CounterTable.name``, field = the key values joined with ``':'`` (a
    null key value is an empty string), value = the plain current count in both modes,
    so readers need not know the mode. Dead letters are JSON strings
    ``{"raw", "reason", "txid"}`` in the list ``dead_letters_key``. Bookkeeping lives
    under ``namespace`` (default ``transactional:<topology id>:<committer name>``):
    ``:txid`` (last committed txid), ``:mode``, ``:fence`` (the highest fence token
    that committed, see ``CommitterContext``), and in opaque mode ``:undo`` and
    ``:undo_dl``.

    Opaque mode keeps one undo log instead of ``(curr, prev, txid)`` per field. The two
    are equivalent here because commits are serial and in txid order: only the last
    committed txid can ever be committed again, so only its previous values are ever
    needed. The log maps ``"<hash>\\0<field>"`` to the value before the last txid (or
    ``ABSENT``) for every field that txid touched, and ``:undo_dl`` counts the dead
    letters it pushed, which are the list's tail. Re-committing that txid restores every
    such field, including ones the new attempt no longer has (a replay that dropped
    records stays exact), trims the tail, then applies and records a new log.
    """

    def __init__(
        self,
        url: str,
        counters: Mapping[str, CounterTable],
        dead_letters: str | None = None,
        mode: CommitMode = CommitMode.TRANSACTIONAL,
        namespace: str | None = None,
        socket_timeout: float = 30,
        dead_letters_key: str = "dead_letters",
    ) -> None:
        super().__init__(counters, dead_letters, mode)
        self.url = url
        self.namespace = namespace
        self.socket_timeout = socket_timeout
        self.dead_letters_key = dead_letters_key
        self._client: redis.Redis | None = None
        self._script: Any = None

    def open(self, context: CommitterContext) -> None:
        """Connect and check the namespace was not written in the other mode: an opaque
        replay needs the undo log that only opaque commits keep."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.context = context
        if self.namespace is None:
            self.namespace = f"transactional:{context.topology_id}:{context.name}"
        where = _redacted(self.url)
        try:
            # No retry inside redis-py: the runner retries the whole commit, and the
            # txid check makes that exact; a hidden retry would only stretch timeouts.
            client = redis.Redis.from_url(
                self.url,
                socket_timeout=self.socket_timeout,
                socket_connect_timeout=self.socket_timeout,
                retry=Retry(NoBackoff(), 0),
                decode_responses=True,
            )
            client.ping()
            stored = client.get(self._key("mode"))
        except (redis.RedisError, ValueError) as exc:
            raise ConfigurationError(
                f"committer {context.name!r} cannot use Redis at {where}: {exc}. Check that "
                "redis-server is running there and that the URL's host, port, database "
                "and password are right."
            ) from exc
        stored_mode = None if stored is None else str(stored)  # decode_responses=True
        if stored_mode is not None and stored_mode != self.mode.value:
            client.close()
            raise ConfigurationError(
                f"Redis namespace {self.namespace!r} was committed in {stored_mode} mode, "
                f"but committer {context.name!r} is in {self.mode.value} mode; switching "
                "would lose exactly-once. Use a new namespace (or topology id)."
            )
        self._client = client
        self._script = client.register_script(_COMMIT_SCRIPT)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _key(self, suffix: str) -> str:
        return f"{self.namespace}:{suffix}"

    def prepare(self, attempt: TransactionAttempt, inputs: Mapping[str, DataFrame]) -> RedisBatch:
        """Bring the batch to the driver, summed per field: the script needs the values,
        and summing here keeps the one atomic call as short as possible."""
        self.check_inputs(inputs)
        batch = RedisBatch(attempt.txid)
        for input_name, table in self.counters.items():
            frame = inputs[input_name].select(*table.keys, table.value).toArrow()
            key_columns = [frame.column(k).to_pylist() for k in table.keys]
            sums: dict[str, int] = defaultdict(int)
            for row, value in enumerate(frame.column(table.value).to_pylist()):
                if value is None:
                    continue
                key = ":".join("" if col[row] is None else str(col[row]) for col in key_columns)
                sums[key] += _as_int(value, table)
            overflow = [k for k, v in sums.items() if abs(v) >= _INT64]
            if overflow:
                raise CommitError(
                    f"counter table {table.name!r}: increments for {overflow[:5]} overflow "
                    "a 64-bit Redis integer"
                )
            batch.counters[table.name] = dict(sums)
        if self.dead_letters is not None:
            frame = inputs[self.dead_letters].select("raw", "reason").toArrow()
            for raw, reason in zip(
                frame.column("raw").to_pylist(), frame.column("reason").to_pylist(), strict=True
            ):
                item = {"raw": raw, "reason": reason, "txid": attempt.txid}
                batch.dead_letters.append(json.dumps(item, ensure_ascii=False))
        return batch

    def commit(self, attempt: TransactionAttempt, prepared: RedisBatch) -> CommitOutcome:
        """One script call: check the txid, undo (opaque replay), apply, record the txid.
        A lost reply is safe to retry: the script sees its own txid and skips or redoes."""
        import redis

        if self._client is None or self._script is None:
            raise CommitError("RedisCommitter.commit before open(): the runner must open it")
        if prepared.txid != attempt.txid:
            raise CommitError(
                f"prepared batch is for txid {prepared.txid}, commit was asked for "
                f"{attempt.txid}: a stale prepare result reached commit"
            )
        hashes = list(prepared.counters)
        keys = [self._key(s) for s in ("txid", "undo", "undo_dl", "mode")]
        keys += [self.dead_letters_key, self._key("fence"), *hashes]
        counters = [
            [7 + i, [x for f, inc in prepared.counters[h].items() for x in (f, str(inc))]]
            for i, h in enumerate(hashes)
        ]
        # Read at each commit: the runner raises it when it takes leadership back.
        token = None if self.context is None else self.context.fence_token
        payload: dict[str, Any] = {
            "txid": str(attempt.txid),
            "mode": self.mode.value,
            "absent": ABSENT,
            "dl": self.dead_letters is not None,
            "counters": counters,
            "dead": prepared.dead_letters,
        }
        if token is not None:
            payload["fence"] = str(token)
        try:
            status, detail = self._script(keys=keys, args=[json.dumps(payload)])
        except redis.RedisError as exc:
            raise CommitError(
                f"Redis commit of txid {attempt.txid} at {_redacted(self.url)} failed: "
                f"{type(exc).__name__}: {exc}. Retrying the commit is safe."
            ) from exc
        if status == "applied":
            return CommitOutcome.APPLIED
        if status == "reapplied":
            return CommitOutcome.REAPPLIED
        if status == "skipped":
            return CommitOutcome.SKIPPED
        if status == "fenced":
            raise FencedError(
                f"Redis namespace {self.namespace!r} refused txid {attempt.txid}: it holds "
                f"fence token {detail}, this runner's is {token}. Another runner has led "
                "the topology since this one lost its leadership; nothing was written, "
                "and this runner must stop. (If the state store was reset, reset this "
                "namespace too: tokens start again with the store.)"
            )
        raise CommitError(self._refusal(attempt.txid, status, detail))

    def _refusal(self, txid: int, status: str, detail: str) -> str:
        if status == "behind":
            return (
                f"opaque commit of txid {txid} refused: Redis namespace {self.namespace!r} "
                f"already holds txid {detail}. The sink is ahead of the state store; was "
                "the store reset or another topology given this namespace?"
            )
        if status == "mode":
            return (
                f"namespace {self.namespace!r} was committed in {detail} mode; this "
                f"committer is in {self.mode.value} mode. Use a new namespace."
            )
        if status == "foreign":
            return (
                f"cannot undo txid {txid}: the tail of list {detail!r} is not the dead "
                "letters it pushed. Another writer appends to it; give this committer "
                "its own dead_letters_key."
            )
        return f"Redis refused txid {txid}: {detail}. Remove or rename the conflicting key."

    def committed_txid(self) -> int | None:
        import redis

        if self._client is None:
            raise CommitError("RedisCommitter.committed_txid before open()")
        try:
            value = self._client.get(self._key("txid"))
        except redis.RedisError as exc:
            raise CommitError(
                f"cannot read the committed txid from Redis at {_redacted(self.url)}: {exc}"
            ) from exc
        return None if value is None else int(value)
