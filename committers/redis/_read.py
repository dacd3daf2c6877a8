"""Reading a Redis committer's hashes back, each value in its declared type: the
helpers, and ``RedisReads``, the committer's reading side."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from committers.keys import decode_key, encode_key
from committers.redis._cluster import SlotOwner, is_cluster, slot_of
from committers.redis._send import waited
from committers.states import key_texts
from committers.tables import CounterTable, Number
from committers.values import parse_text
from transactional.errors import CommitError, ConfigurationError
from transactional.secrets import redact_url

if TYPE_CHECKING:
    import redis

__all__ = ["RedisReads", "RedisSnapshot", "read_hashes", "read_snapshot"]

Values = dict[tuple[str | None, ...], Number]

#: The txid marker, written again as it is (a write, so that a ``WAIT`` after it covers
#: every earlier write to the namespace: replication keeps the order of writes).
_HELD_TXID = (
    "local v = redis.call('GET', KEYS[1]) if v then redis.call('SET', KEYS[1], v) end return v"
)


@dataclass(frozen=True)
class RedisSnapshot:
    """All of a committer's hashes and its dead letters as of one committed txid, read
    in one MULTI/EXEC (every commit is one script, so no commit is half seen)."""

    txid: int | None
    tables: dict[str, Values]
    dead_letters: list[dict[str, Any]]


def _decoded(table: CounterTable, fields: dict[str, str]) -> Values:
    declared = table.declared
    return {decode_key(f, len(table.keys)): parse_text(v, declared) for f, v in fields.items()}


def read_hashes(
    client: redis.Redis, tables: Sequence[CounterTable], prefix: str = ""
) -> dict[str, Values]:
    """Each table's hash (``prefix`` + its name; one HGETALL each: a consistent view of
    that hash), keyed by the key columns' texts (None: null), values as Python's exact
    type."""
    return {t.name: _decoded(t, client.hgetall(prefix + t.name)) for t in tables}  # type: ignore[arg-type]


def read_snapshot(
    client: redis.Redis,
    tables: Sequence[CounterTable],
    txid_key: str,
    dead_key: str | None,
    prefix: str = "",
) -> RedisSnapshot:
    """The committed txid (``txid_key``), every table (hash ``prefix`` + its name) and
    the dead letters (the list ``dead_key``, None: no dead letters) in one MULTI/EXEC."""
    pipe = client.pipeline(transaction=True)
    pipe.get(txid_key)
    for table in tables:
        pipe.hgetall(prefix + table.name)
    if dead_key is not None:
        pipe.lrange(dead_key, 0, -1)
    txid, *rest = pipe.execute()
    hashes, dead = (rest[:-1], rest[-1]) if dead_key is not None else (rest, [])
    return RedisSnapshot(
        None if txid is None else int(txid),
        {t.name: _decoded(t, h) for t, h in zip(tables, hashes, strict=True)},
        [json.loads(item) for item in dead],
    )


class RedisReads:
    """What ``RedisCommitter`` reads back: the txid a namespace holds, a counter table,
    some keys, everything as of one txid, the dead letters' count. Each needs no ``open``
    (a client of the right server is made and closed), except ``read_all`` without a
    ``namespace``."""

    url: str
    socket_timeout: float
    key_prefix: str
    namespace: str | None
    dead_letters: str | None
    dead_letters_key: str
    _client: redis.Redis | None
    _owner: SlotOwner | None
    _tables: dict[str, CounterTable]
    default_namespace: Callable[[str, str], str]
    _connect: Callable[[], redis.Redis]
    _server: Callable[[], redis.Redis]
    _hash: Callable[[str], str]
    _key: Callable[[str], str]
    _lost: Callable[[BaseException], None]
    _replicas: int
    wait_timeout_s: float

    def committed_txid(self) -> int | None:
        """The txid the namespace holds. With replicas to wait for, only once they
        acknowledged it (else a ``CommitError``): the runner reads this when a commit's
        outcome is unknown, and must not take for done a txid a failover could lose."""
        import redis

        key = self._key("txid")
        try:
            if not self._replicas:
                value = self._server().get(key)
            else:
                value, acked = waited(
                    self._server(), self._replicas, self.wait_timeout_s, "EVAL", _HELD_TXID, 1, key
                )
                if value is not None and acked < self._replicas:
                    raise CommitError(
                        f"Redis namespace {self.namespace!r} holds txid {value}, but {acked} "
                        f"of the {self._replicas} replica(s) it waits for acknowledged it "
                        f"within {self.wait_timeout_s}s: not yet a txid that survives the "
                        "loss of the master"
                    )
        except redis.RedisError as exc:
            self._lost(exc)
            raise CommitError(
                f"cannot read the committed txid from Redis at {redact_url(self.url)}: {exc}"
            ) from exc
        return None if value is None else int(value)

    def sink_marker(self, topology_id: str, name: str) -> int | None:
        import redis

        key = f"{self.namespace or self.default_namespace(topology_id, name)}:txid"
        try:
            with self._reader(key) as client:
                value = client.get(key)
        except redis.RedisError as exc:
            raise CommitError(
                f"cannot read the committed txid from Redis at {redact_url(self.url)}: {exc}"
            ) from exc
        return None if value is None else int(value)  # type: ignore[arg-type]

    @contextmanager
    def _reader(self, key: str) -> Iterator[redis.Redis]:
        """The open committer's server, else a client of the server holding ``key``
        (on a Redis Cluster, its slot's master), closed after."""
        if self._client is not None or self._owner is not None:
            yield self._server()
            return
        client = self._connect()
        owner = None
        try:
            if is_cluster(client):
                owner = SlotOwner(self.url, slot_of(key), self.socket_timeout)
                yield owner.client()
            else:
                yield client
        finally:
            client.close()
            if owner is not None:
                owner.close()

    def read(self, table: str) -> dict[tuple[str | None, ...], Number]:
        """The current values of counter table ``table`` (its name), keyed by the key
        columns' texts (None: null), each value as Python's exact type (int, float,
        Decimal). One HGETALL: a consistent view of that hash. Needs no ``open``."""
        if table not in self._tables:
            raise ConfigurationError(f"no counter table {table!r}; have {sorted(self._tables)}")
        with self._reader(self._hash(table)) as client:
            return read_hashes(client, [self._tables[table]], self.key_prefix)[table]

    def lookup(self, table: CounterTable, keys: list[tuple[Any, ...]]) -> list[Number | None]:
        """One HMGET of the keys' fields (``committers.states.key_texts``)."""
        import redis

        fields = [encode_key(key_texts(key)) for key in keys]
        try:
            with self._reader(self._hash(table.name)) as client:
                held: list[str | None] = client.hmget(self._hash(table.name), fields)  # type: ignore[assignment]
        except redis.RedisError as exc:
            raise CommitError(
                f"cannot read Redis hash {table.name!r} at {redact_url(self.url)}: {exc}"
            ) from exc
        declared = table.declared
        return [None if v is None else parse_text(v, declared) for v in held]

    def read_all(self) -> RedisSnapshot:
        """Every counter table, the dead letters and the committed txid, in one
        MULTI/EXEC: all as of one committed txid. Needs ``open`` or a ``namespace``."""
        if self.namespace is None:
            raise ConfigurationError(
                "RedisCommitter.read_all needs the namespace: open() the committer or pass "
                "namespace= (default transactional:<topology id>:<committer name>)"
            )
        dead = self.dead_letters_key if self.dead_letters is not None else None
        tables = list(self._tables.values())
        with self._reader(self._key("txid")) as client:
            return read_snapshot(client, tables, self._key("txid"), dead, self.key_prefix)

    def dead_letter_count(self) -> int:
        """How many dead letters the list holds (one LLEN). Needs no ``open``."""
        with self._reader(self.dead_letters_key) as client:
            return int(client.llen(self.dead_letters_key))  # type: ignore[arg-type]
