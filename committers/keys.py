"""Key columns: which Spark types each sink can key on, and the Redis field encoding.

Two different keys must never land on one sink row: a merged key counts two things as
one, silently. Delta keeps each key column apart (a MERGE matches them column by
column), so what matters there is that the match is exact: float keys (NaN, -0.0) and
map/array/struct keys are refused. A Redis hash has one string per field, so a key of
several columns is encoded into one string, reversibly:

- each column's value as text: a string as is; an integer in decimal; a boolean as
  ``true``/``false``; a date as ``YYYY-MM-DD`` (what Spark's ``CAST(x AS STRING)``
  writes);
- in that text ``\\`` becomes ``\\\\`` and, when the key has several columns, ``:``
  becomes ``\\:``; a null is ``\\N`` (which no escaped value can be);
- the columns joined with ``:``.

So a single-column key is its plain value (only a backslash is doubled), as the demo's
readers expect; ``("@a:#b", "#c")`` is ``@a\\:#b:#c`` and ``("@a", "#b:#c")`` is
``@a:#b\\:#c``; ``("", None)`` is ``:\\N``. ``decode_key`` reverses it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "DELTA_KEY_TYPES",
    "NULL_FIELD",
    "REDIS_KEY_TYPES",
    "decode_key",
    "encode_key",
    "key_text",
    "parse_key_type",
]

SEPARATOR = ":"
ESCAPE = "\\"
#: A null key column, in a Redis field.
NULL_FIELD = "\\N"

_ALIASES = {
    "string": "string",
    "byte": "tinyint",
    "tinyint": "tinyint",
    "short": "smallint",
    "smallint": "smallint",
    "int": "int",
    "integer": "int",
    "long": "bigint",
    "bigint": "bigint",
    "boolean": "boolean",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
    "binary": "binary",
    "float": "float",
    "double": "double",
}
_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")
_INTEGERS = ("tinyint", "smallint", "int", "bigint")

#: Key types whose values Redis fields hold as text that maps back to one value.
REDIS_KEY_TYPES = frozenset({"string", *_INTEGERS, "boolean", "date"})
#: Key types a Delta MERGE matches exactly (``decimal(p,s)`` too, see ``supported``).
DELTA_KEY_TYPES = frozenset({*REDIS_KEY_TYPES, "timestamp", "timestamp_ntz", "binary"})


def parse_key_type(text: str) -> str:
    """Spark's ``simpleString`` of a key type named in ``CounterTable.key_types``
    (``"string"``, ``"long"``, ``"decimal(10,2)"``...). Raises ``ValueError``."""
    norm = re.sub(r"\s+", "", str(text)).lower()
    if norm in _ALIASES:
        return _ALIASES[norm]
    if _DECIMAL.match(norm) or norm.split("<", 1)[0] in ("map", "array", "struct"):
        return norm
    raise ValueError(f"unknown key type {text!r}")


def supported(sql: str, sink: str) -> bool:
    """Whether a key column of Spark type ``sql`` can key a row of ``sink`` (``"redis"``
    or ``"delta"``)."""
    if sink == "redis":
        return sql in REDIS_KEY_TYPES
    return sql in DELTA_KEY_TYPES or _DECIMAL.match(sql) is not None


def why_unsupported(sql: str) -> str:
    """What to do about a key type a sink refuses."""
    if sql in ("float", "double"):
        return "floating-point keys do not match exactly (NaN, -0.0): cast to decimal or string"
    if sql.split("<", 1)[0] in ("map", "array", "struct"):
        return "encode the value as a string (e.g. to_json) in the bolt"
    return "cast the column to a string in the bolt, formatted as readers expect"


def exact_key_cast(source: str, target: str) -> bool:
    """Whether casting a batch key of type ``source`` to a table key of type ``target``
    keeps distinct values distinct (``"01"`` and ``"1"`` cast to INT would merge)."""
    if source == target:
        return True
    if source in _INTEGERS and target in _INTEGERS:
        return _INTEGERS.index(source) <= _INTEGERS.index(target)
    if target == "string":
        return source in (*_INTEGERS, "boolean", "date")
    src, dst = _DECIMAL.match(source), _DECIMAL.match(target)
    if src is None or dst is None:
        return False
    p, s, q, t = (int(x) for x in (*src.groups(), *dst.groups()))
    return s <= t and p - s <= q - t


def key_text(sql: str) -> Callable[[Any], str | None]:
    """The text a Redis field holds for a value of a key column of type ``sql``."""
    if sql == "string":
        return lambda v: v
    if sql == "boolean":
        return lambda v: None if v is None else ("true" if v else "false")
    if sql == "date":
        return lambda v: None if v is None else v.isoformat()
    if sql in _INTEGERS:
        return lambda v: None if v is None else str(int(v))
    raise ValueError(f"no Redis text for key type {sql!r}")


def _escape(value: str | None, several: bool) -> str:
    if value is None:
        return NULL_FIELD
    value = value.replace(ESCAPE, ESCAPE + ESCAPE)
    return value.replace(SEPARATOR, ESCAPE + SEPARATOR) if several else value


def encode_key(values: Sequence[str | None]) -> str:
    """The Redis field of a key, given each column's text (None: null)."""
    if len(values) == 1:
        return _escape(values[0], False)
    return SEPARATOR.join(_escape(v, True) for v in values)


def decode_key(field: str, columns: int | Sequence[str]) -> tuple[str | None, ...]:
    """The key columns' texts (None: null) of a Redis field written by ``encode_key``;
    ``columns`` is the number of key columns or their names. Raises ``ValueError`` on a
    field this encoding never writes."""
    width = columns if isinstance(columns, int) else len(columns)
    parts: list[str | None] = []
    text: list[str] = []
    null = False
    i = 0
    while i <= len(field):
        char = field[i] if i < len(field) else None
        if char is None or (char == SEPARATOR and width > 1):
            parts.append(None if null else "".join(text))
            text, null = [], False
        elif char == ESCAPE:
            nxt = field[i + 1] if i + 1 < len(field) else ""
            if nxt == "N" and not text and not null:
                null = True
            elif nxt == ESCAPE or (nxt == SEPARATOR and width > 1):
                text.append(nxt)
            else:
                raise ValueError(f"field {field!r}: {ESCAPE!r} at {i} escapes nothing")
            i += 1
        elif null:
            raise ValueError(f"field {field!r}: {NULL_FIELD!r} followed by text")
        else:
            text.append(char)
        i += 1
    if null and text:
        raise ValueError(f"field {field!r}: {NULL_FIELD!r} followed by text")
    if len(parts) != width:
        raise ValueError(f"field {field!r} holds {len(parts)} key column(s), not {width}")
    return tuple(parts)


def key_types_of(declared: Mapping[str, str]) -> dict[str, str]:
    """``CounterTable.key_types`` with each type parsed (``ValueError`` names the bad one)."""
    out: dict[str, str] = {}
    for column, text in declared.items():
        try:
            out[column] = parse_key_type(text)
        except ValueError as exc:
            raise ValueError(f"key column {column!r}: {exc}") from exc
    return out
