"""Reading a Redis committer's hashes back, each value in its declared type."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from committers.keys import decode_key
from committers.tables import CounterTable, Number
from committers.values import parse_text

if TYPE_CHECKING:
    import redis

__all__ = ["RedisSnapshot", "read_hashes", "read_snapshot"]

Values = dict[tuple[str | None, ...], Number]


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
