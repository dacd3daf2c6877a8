"""Aggregate states, after Trident's ``persistentAggregate``: a constructor per
aggregate, each a ``CounterTable`` that a ``RedisCommitter`` or ``DeltaCommitter``
keeps per key, exactly once, in transactional and opaque mode; and reading them back
by key (``RedisCommitter.state(name).get(keys)``, ``DeltaCommitter.state(...)``).

::

    RedisCommitter(url, counters={
        "views": Count("page_views", keys=("page",)),
        "spent": Sum("spent", keys=("user",), value="amount", value_type="decimal(18,2)"),
        "low":   Min("lowest_price", keys=("item",), value="price", value_type="double"),
        "high":  Max("highest_price", keys=("item",), value="price", value_type="double"),
        "seen":  Last("last_seen", keys=("user",), value="at_ms", order_by="offset"),
    })

Each input (``views``, ``spent``...) is a stream the topology wires to the committer;
its rows carry the key columns and the value column (and ``order_by`` for ``Last``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime
from typing import Any

from committers.keys import decode_key, key_text
from committers.tables import CounterTable

__all__ = ["Count", "Last", "Max", "Min", "Sum", "key_of"]

Keys = Sequence[str] | str


def _keys(keys: Keys) -> tuple[str, ...]:
    return (keys,) if isinstance(keys, str) else tuple(keys)


def _valued(
    aggregate: str,
    name: str,
    keys: Keys,
    value: str | None,
    value_type: str,
    key_types: Mapping[str, str] | None,
    order_by: str | None = None,
) -> CounterTable:
    return CounterTable(
        name, _keys(keys), value, value_type, dict(key_types or {}), aggregate, order_by
    )


def Count(
    name: str, keys: Keys, value: str | None = None, key_types: Mapping[str, str] | None = None
) -> CounterTable:
    """The number of rows per key (``value`` None), or of non-null ``value``s: a LONG."""
    return _valued("count", name, keys, value, "long", key_types)


class _ValueAggregate:
    """The constructor of one aggregate of a value column per key (``Sum``, ``Min``,
    ``Max``): ``value`` the column, ``value_type`` its SQL type (``long``, ``double``,
    ``decimal(p,s)``...), ``key_types`` the key columns' types where not strings."""

    def __init__(self, aggregate: str) -> None:
        self.aggregate = aggregate

    def __call__(
        self,
        name: str,
        keys: Keys,
        value: str,
        value_type: str = "long",
        key_types: Mapping[str, str] | None = None,
    ) -> CounterTable:
        return _valued(self.aggregate, name, keys, value, value_type, key_types)

    def __repr__(self) -> str:
        return self.aggregate.title()


Sum = _ValueAggregate("sum")
"""``Sum(name, keys, value, value_type="long", key_types=None)``: the sum of ``value``
per key, in ``value_type`` (a counter of increments)."""
Min = _ValueAggregate("min")
"""``Min(name, keys, value, value_type="long", key_types=None)``: the smallest
``value`` ever seen per key."""
Max = _ValueAggregate("max")
"""``Max(name, keys, value, value_type="long", key_types=None)``: the greatest
``value`` ever seen per key."""


def Last(
    name: str,
    keys: Keys,
    value: str,
    order_by: str,
    value_type: str = "long",
    key_types: Mapping[str, str] | None = None,
) -> CounterTable:
    """The latest ``value`` per key: of the latest txid that had one, the row with the
    greatest ``order_by`` (a batch whose greatest ``order_by`` of a key carries two
    different values is refused: its last value is not defined)."""
    return _valued("last", name, keys, value, value_type, key_types, order_by)


def key_of(key: Any, table: CounterTable) -> tuple[Any, ...]:
    """A key as given to ``get``: a tuple of the key columns' values, or for a table of
    one key column its plain value."""
    width = len(table.keys)
    if isinstance(key, tuple):
        if len(key) != width:
            raise ValueError(
                f"key {key!r} has {len(key)} value(s); table {table.name!r} is keyed by "
                f"{list(table.keys)}"
            )
        return key
    if width != 1:
        raise ValueError(
            f"table {table.name!r} is keyed by {list(table.keys)}: give each key as a tuple"
        )
    return (key,)


def key_texts(key: tuple[Any, ...]) -> tuple[str | None, ...]:
    """A key's values as Redis field texts (``committers.keys``): strings as they are,
    integers in decimal, booleans ``true``/``false``, dates ISO, None null."""
    return tuple(key_text(_key_type(value))(value) for value in key)


def _key_type(value: Any) -> str:
    """The Redis key type (``committers.keys``) of a Python key value."""
    if value is None or isinstance(value, str):
        return "string"
    if isinstance(value, bool):  # before int: a bool is an int
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, date) and not isinstance(value, datetime):
        return "date"
    raise ValueError(
        f"key value {value!r} ({type(value).__name__}): a Redis key is a string, an "
        "integer, a boolean or a date"
    )


class StateReader:
    """One aggregate state of a committer, read by key. ``get(keys)`` returns the values
    in the order of ``keys`` (None: the key holds nothing), each in Python's exact type
    for the value type (int, float, Decimal)."""

    def __init__(self, table: CounterTable, lookup: Any) -> None:
        self.table = table
        self._lookup = lookup

    @property
    def name(self) -> str:
        return self.table.name

    def get(self, keys: Iterable[Any]) -> list[Any]:
        wanted = [key_of(key, self.table) for key in keys]
        if not wanted:
            return []
        return list(self._lookup(wanted))

    def parse_keys(self, texts: Iterable[str]) -> list[tuple[str | None, ...]]:
        """Keys given as text (``transactional query``), in the Redis field encoding
        (``committers.keys``): several columns joined by ``:``, a ``:`` or ``\\``
        inside a value escaped with ``\\``, ``\\N`` a null. Each column's text is read
        as the column's type by ``get``. Raises ``ValueError`` saying what to type."""
        columns = self.table.keys
        keys = []
        for text in texts:
            try:
                keys.append(decode_key(text, len(columns)))
            except ValueError as exc:
                how = (
                    "write its value with each '\\' as '\\\\' ('\\N': a null)"
                    if len(columns) == 1
                    else f"give {len(columns)} values joined by ':', in each '\\' written "
                    "'\\\\' and ':' written '\\:' ('\\N': a null)"
                )
                raise ValueError(
                    f"key {text!r}: {exc}; state {self.name!r} is keyed by {list(columns)}: {how}"
                ) from exc
        return keys
