"""Reading a Redis committer's hashes back, each value in its declared type: the
helpers, and ``RedisReader``, the committer's reading side."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from committers.keys import decode_key, encode_key
from committers.redis._connection import RedisConnection
from committers.redis._names import RedisKeys
from committers.redis._send import waited
from committers.states import key_texts
from committers.tables import CounterTable, Number
from committers.values import parse_text
from transactional.errors import CommitError, ConfigurationError
from transactional.secrets import redact_url

if TYPE_CHECKING:
    import redis

__all__ = ["RedisReader", "RedisSnapshot", "read_hashes", "read_snapshot"]

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


class RedisReader:
    """What a ``RedisCommitter`` reads back (an object the committer owns, over its
    connection and its key naming): the txid a namespace holds, a counter table, some
    keys, everything as of one txid, the dead letters' count. Each needs no ``open`` (a
    client of the right server is made and closed), except ``read_all`` without a
    ``namespace``."""

    def __init__(
        self,
        connection: RedisConnection,
        keys: RedisKeys,
        tables: Mapping[str, CounterTable],
        dead_letters: bool,
        wait_timeout_s: float,
    ) -> None:
        self._connection = connection
        self._keys = keys
        self._tables = tables  # counter table name -> its spec
        self._dead_letters = dead_letters  # whether the committer keeps dead letters
        self._wait_timeout_s = wait_timeout_s

    def committed_txid(self) -> int | None:
        """The txid the namespace holds. With replicas to wait for, only once they
        acknowledged it (else a ``CommitError``): the runner reads this when a commit's
        outcome is unknown, and must not take for done a txid a failover could lose."""
        import redis

        key = self._keys.key("txid")
        replicas, timeout = self._connection.replicas, self._wait_timeout_s
        try:
            if not replicas:
                value = self._connection.server().get(key)
            else:
                server = self._connection.server()
                value, acked = waited(server, replicas, timeout, "EVAL", _HELD_TXID, 1, key)
                if value is not None and acked < replicas:
                    raise CommitError(
                        f"Redis namespace {self._keys.namespace!r} holds txid {value}, but "
                        f"{acked} of the {replicas} replica(s) it waits for acknowledged it "
                        f"within {timeout}s: not yet a txid that survives the loss of the "
                        "master"
                    )
        except redis.RedisError as exc:
            self._connection.lost(exc)
            raise CommitError(
                f"cannot read the committed txid from Redis at {self._where()}: {exc}"
            ) from exc
        return None if value is None else int(value)

    def sink_marker(self, topology_id: str, name: str) -> int | None:
        """The txid the namespace of committer ``name`` of ``topology_id`` holds (this
        committer's ``namespace`` when it has one)."""
        import redis

        namespace = self._keys.namespace or self._keys.default_namespace(topology_id, name)
        key = f"{namespace}:txid"
        try:
            with self._connection.reader(key) as client:
                value = client.get(key)
        except redis.RedisError as exc:
            raise CommitError(
                f"cannot read the committed txid from Redis at {self._where()}: {exc}"
            ) from exc
        return None if value is None else int(value)

    def read(self, table: str) -> Values:
        """The current values of counter table ``table`` (its name), keyed by the key
        columns' texts (None: null), each value as Python's exact type (int, float,
        Decimal). One HGETALL: a consistent view of that hash. Needs no ``open``."""
        if table not in self._tables:
            raise ConfigurationError(f"no counter table {table!r}; have {sorted(self._tables)}")
        with self._connection.reader(self._keys.hash(table)) as client:
            return read_hashes(client, [self._tables[table]], self._keys.prefix)[table]

    def lookup(self, table: CounterTable, keys: list[tuple[Any, ...]]) -> list[Number | None]:
        """One HMGET of the keys' fields (``committers.states.key_texts``)."""
        import redis

        fields = [encode_key(key_texts(key)) for key in keys]
        name = self._keys.hash(table.name)
        try:
            with self._connection.reader(name) as client:
                held: list[str | None] = client.hmget(name, fields)  # type: ignore[assignment]
        except redis.RedisError as exc:
            raise CommitError(
                f"cannot read Redis hash {table.name!r} at {self._where()}: {exc}"
            ) from exc
        declared = table.declared
        return [None if v is None else parse_text(v, declared) for v in held]

    def read_all(self) -> RedisSnapshot:
        """Every counter table, the dead letters and the committed txid, in one
        MULTI/EXEC: all as of one committed txid. Needs ``open`` or a ``namespace``."""
        if self._keys.namespace is None:
            raise ConfigurationError(
                "RedisCommitter.read_all needs the namespace: open() the committer or pass "
                "namespace= (default transactional:<topology id>:<committer name>)"
            )
        dead = self._keys.dead_letters if self._dead_letters else None
        tables = list(self._tables.values())
        txid = self._keys.key("txid")
        with self._connection.reader(txid) as client:
            return read_snapshot(client, tables, txid, dead, self._keys.prefix)

    def dead_letter_count(self) -> int:
        """How many dead letters the list holds (one LLEN). Needs no ``open``."""
        with self._connection.reader(self._keys.dead_letters) as client:
            return int(client.llen(self._keys.dead_letters))

    def _where(self) -> str:
        return redact_url(self._connection.url)
