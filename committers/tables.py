"""The spec of a committer's table (``CounterTable``): its keys, its value and value
type, and the aggregate it keeps per key; checked at construction, so that a wiring
mistake fails before anything runs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from committers.keys import key_types_of
from committers.values import ValueType
from transactional.errors import ConfigurationError

__all__ = [
    "AGGREGATES",
    "ORDERABLE",
    "RESERVED_COLUMNS",
    "VALUE_COLUMNS",
    "CounterTable",
    "Number",
    "unstorable",
]

#: A counter's value in Python: ``long`` -> int, ``double`` -> float, ``decimal`` -> Decimal.
Number = int | float | Decimal

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")

#: Column names the sinks use for their own bookkeeping; a key with one of these names
#: would be overwritten by it. (A table's value column is reserved too: ``column``.)
RESERVED_COLUMNS = frozenset({"prev", "txid", "inc"})

#: What a table keeps per key, after Trident's ``persistentAggregate`` aggregators:
#: ``sum`` (the counters: increments added), ``count`` (rows, or non-null values, counted),
#: ``min`` and ``max`` (the extreme value ever seen), ``last`` (the value of the latest
#: txid; inside one batch, of the row with the greatest ``order_by``).
AGGREGATES = ("sum", "count", "min", "max", "last")

#: The value columns a sink's table may have (``CounterTable.column``).
VALUE_COLUMNS = ("count", "min", "max", "last")

#: Spark types an ``order_by`` column may have: they compare as their values do.
ORDERABLE = re.compile(
    r"^(tinyint|smallint|int|bigint|float|double|string|date|timestamp|timestamp_ntz"
    r"|decimal\(\d+,\d+\))$"
)


@dataclass(frozen=True, slots=True)
class CounterTable:
    """One aggregate state: the input rows are ``(keys..., value)``, aggregated per key
    into the sink (``name`` is the Redis hash / the Delta table directory). ``aggregate``
    says how (``AGGREGATES``; ``committers.states`` has a constructor for each): the
    default ``"sum"`` is a counter, whose rows are increments.

    Increments, not totals, are what a batch carries, because only increments can be
    applied once per txid whatever the sink held before; the sink turns them into
    current counts. ``min``, ``max`` and ``last`` are applied the same way: the sink
    keeps the smaller, the greater, or the newer of what it held and the batch's value.
    Null values count as nothing: a key whose batch values are all null is not
    touched.

    ``count`` counts a key's rows (``value=None``) or the non-null values of ``value``;
    its ``value_type`` is ``long``. ``last`` needs ``order_by``, the column saying which
    of a batch's rows of a key is the latest (an offset, an event time): of two txids,
    the later one's value wins; a batch whose greatest ``order_by`` of a key carries two
    different values is refused, as its last value is not defined.

    ``value_type`` is the type the sink stores: ``"long"`` (default), ``"double"`` or
    ``"decimal(p,s)"`` (``committers.values``); a batch whose value column it cannot
    hold exactly is refused, never narrowed. ``key_types`` optionally declares key
    column types (Spark names: ``"string"``, ``"long"``, ``"date"``...): a committer
    refuses at construction a type it cannot key on, and Delta creates missing tables
    with them (undeclared keys: STRING).
    """

    name: str
    keys: tuple[str, ...]
    value: str | None = "count"
    value_type: str = "long"
    key_types: Mapping[str, str] = field(default_factory=dict, hash=False)
    aggregate: str = "sum"
    order_by: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.keys, list):
            object.__setattr__(self, "keys", tuple(self.keys))
        try:
            declared = ValueType.parse(self.value_type)
        except ValueError as exc:
            raise ConfigurationError(f"counter table {self.name!r}: {exc}") from exc
        object.__setattr__(self, "value_type", declared.name)
        self._check_aggregate()
        if not _NAME.match(self.name):
            raise ConfigurationError(
                f"counter table name {self.name!r} is not usable as a Redis key and a "
                "directory name: use letters, digits, '_' or '-'"
            )
        if isinstance(self.keys, str) or not self.keys:
            raise ConfigurationError(
                f"counter table {self.name!r}: keys must be a non-empty tuple of column "
                f"names, got {self.keys!r}"
            )
        if len(set(self.inputs)) != len(self.inputs):
            raise ConfigurationError(
                f"counter table {self.name!r}: key, value and order_by columns must be "
                f"distinct, got keys={self.keys!r} value={self.value!r}"
                + (f" order_by={self.order_by!r}" if self.order_by else "")
            )
        own = RESERVED_COLUMNS | {self.column}
        clash = own.intersection(self.keys)
        if clash:
            raise ConfigurationError(
                f"counter table {self.name!r}: key column(s) {sorted(clash)} clash with "
                f"the sink's own columns {sorted(own)}; rename them upstream"
            )
        unknown = sorted(set(self.key_types) - set(self.keys))
        if unknown:
            raise ConfigurationError(
                f"counter table {self.name!r}: key_types names {unknown}, which are not "
                f"among its keys {list(self.keys)}"
            )
        try:
            parsed = key_types_of(self.key_types)
        except ValueError as exc:
            raise ConfigurationError(f"counter table {self.name!r}: {exc}") from exc
        # A plain (copied) dict, not a read-only proxy: committers must stay picklable.
        object.__setattr__(self, "key_types", parsed)

    def _check_aggregate(self) -> None:
        where = f"counter table {self.name!r}"
        if self.aggregate not in AGGREGATES:
            raise ConfigurationError(
                f"{where}: aggregate={self.aggregate!r} is not one of {list(AGGREGATES)}"
            )
        if self.value is None and self.aggregate != "count":
            raise ConfigurationError(
                f"{where}: aggregate {self.aggregate!r} needs a value column (value=None "
                "only counts rows, for aggregate='count')"
            )
        if self.aggregate == "count" and self.declared.kind != "long":
            raise ConfigurationError(
                f"{where}: a count is a 'long'; value_type={self.value_type!r} is not"
            )
        if (self.order_by is None) == (self.aggregate == "last"):
            raise ConfigurationError(
                f"{where}: aggregate 'last' needs order_by= (the column telling which of a "
                "batch's rows of a key is the latest: an offset, an event time)"
                if self.order_by is None
                else f"{where}: order_by is for aggregate 'last' only, not {self.aggregate!r}"
            )

    @property
    def declared(self) -> ValueType:
        """``value_type``, parsed."""
        return ValueType.parse(self.value_type)

    @property
    def column(self) -> str:
        """The sink's value column (Delta): ``count`` for sums and counts, else the
        aggregate's name (``min``, ``max``, ``last``)."""
        return "count" if self.aggregate in ("sum", "count") else self.aggregate

    @property
    def combine(self) -> str:
        """How two of its values make one (a stored value and a batch's, or the batches
        of a commit group): counts are added, like sums."""
        return "sum" if self.aggregate == "count" else self.aggregate

    @property
    def inputs(self) -> tuple[str, ...]:
        """The input columns it reads: the keys, the value (if any), ``order_by``."""
        extra = [c for c in (self.value, self.order_by) if c is not None]
        return (*self.keys, *extra)

    @property
    def stored_type(self) -> str:
        """What a Redis namespace records for the hash: the value type, prefixed by the
        aggregate unless it adds (sums and counts are both additions of LONGs)."""
        if self.combine == "sum":
            return self.value_type
        return f"{self.aggregate}:{self.value_type}"


def unstorable(table: CounterTable) -> str:
    """Why a key's batch value of a ``min``, ``max`` or ``last`` table is refused."""
    reasons = []
    if table.declared.kind == "double":
        reasons.append("has a NaN or an infinite value (never stored)")
    if table.aggregate == "last":
        reasons.append(
            f"has different values at its greatest {table.order_by!r} (its last value is "
            "not defined: make order_by tell the rows apart)"
        )
    return ", or ".join(reasons)
