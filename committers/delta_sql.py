"""The Delta committer's arithmetic in Spark SQL: sums that are never narrowed.

Spark's plain ``sum`` and ``+`` wrap a LONG overflow when ANSI mode is off, and round a
decimal sum to fewer decimals when ``spark.sql.decimalOperations.allowPrecisionLoss``
is on; a double overflows to infinity in every mode. So every sum here is a ``try_``
function (null on overflow, whatever the session's ANSI setting), cast back to the
declared type with ``try_cast`` (null if it does not fit), and a value that cannot be
stored makes the job fail through ``raise_error`` carrying ``OVERFLOW_MARK``: the
batch's checkpoint is never made, or the MERGE commits nothing. Finding which keys
overflowed costs a query, run only on that failure path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from committers.counters import COUNT_COLUMN
from committers.tables import CounterTable, unstorable
from committers.values import ValueType
from transactional.columns import prebuilt
from transactional.errors import ContractError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger("committers.delta")

#: Carried by the ``raise_error`` of a value that cannot be stored.
OVERFLOW_MARK = "transactional-value-out-of-range"

#: Working columns of the batch sums; ``inc`` is reserved (``RESERVED_COLUMNS``), these
#: are named so that no key column is called the same.
_VALUE, _COUNT = "__transactional_value", COUNT_COLUMN


def keys_match(keys: tuple[str, ...]) -> str:
    # Null-safe: a null key must match its own row, or every txid would insert a new one.
    return " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in keys)


def not_storable(value: str, declared: ValueType) -> str:
    """SQL: true when ``value`` (already ``try_cast`` to the declared type) cannot be
    stored: null from an overflow, or for a double NaN or an infinity."""
    if declared.kind == "double":
        return f"(isnan({value}) OR abs({value}) = double('infinity'))"
    return f"(({value}) IS NULL)"


def added(base: str, declared: ValueType) -> str:
    """SQL: ``base + s.inc`` in the declared type, null if it does not fit."""
    return f"try_cast(try_add({base}, s.inc) AS {declared.sql})"


def checked_add(base: str, table: CounterTable) -> str:
    """SQL for a MERGE's new value: ``base + s.inc``, or a failed MERGE (nothing
    written) if the sum cannot be stored."""
    declared = table.declared
    value = added(base, declared)
    fail = f"raise_error('{OVERFLOW_MARK} table {table.name}')"
    return f"CASE WHEN {not_storable(value, declared)} THEN {fail} ELSE {value} END"


def new_value(base: str, table: CounterTable) -> str:
    """SQL for a MERGE's new value from what the row held (``base``, may be null: the
    row is new to these txids) and the batch's ``s.inc``, by the table's aggregate;
    a sum that cannot be stored fails the MERGE (``checked_add``)."""
    if table.combine == "sum":
        return checked_add(f"coalesce({base}, {zero(table.declared)})", table)
    if table.combine == "last":
        return "s.inc"
    # least/greatest skip a null: a new row takes the batch's value.
    return f"{'least' if table.combine == 'min' else 'greatest'}({base}, s.inc)"


def zero(declared: ValueType) -> str:
    return f"CAST(0 AS {declared.sql})"


@dataclass(frozen=True)
class _SumColumns:
    rows: list[Column]
    aggregates: list[Column]
    bad: Column
    #: ``inc`` from the aggregates, when it is not one of them (``last``).
    inc: Column | None = None


#: The working column of a ``last``'s order, and of its value negated (``_last``).
_ORDER, _NEGATED = "__transactional_order", "__transactional_negated"
#: A key's count of NaN and infinite double values (``min``, ``max``, ``last``).
_ODD = "__transactional_odd"
#: A ``last``'s greatest ``(order, value)`` and ``(order, -value)``.
_HIGH, _LOW = "__transactional_high", "__transactional_low"


def _sum_columns(table: CounterTable, key_types: dict[str, str]) -> _SumColumns:
    from pyspark.sql import functions as F

    declared = table.declared
    keys = [F.col(k).cast(key_types[k]).alias(k) for k in table.keys]
    if table.aggregate == "count":
        counted = F.lit(1) if table.value is None else F.col(table.value)
        counted = F.when(counted.isNotNull(), F.lit(1).cast("bigint"))
        return _SumColumns(
            rows=[*keys, counted.alias(_VALUE)],
            aggregates=[F.count(_VALUE).alias("inc"), F.count(_VALUE).alias(_COUNT)],
            bad=F.lit(False),
        )
    assert table.value is not None
    rows = [*keys, F.col(table.value).cast(declared.sql).alias(_VALUE)]
    counted = F.count(_VALUE).alias(_COUNT)
    if table.aggregate == "sum":
        total = (
            F.sum(_VALUE)
            if declared.kind == "double"
            else F.expr(f"try_cast(try_sum(`{_VALUE}`) AS {declared.sql})")
        )
        bad = F.coalesce(F.expr(not_storable("inc", declared)), F.lit(False)) & (F.col(_COUNT) > 0)
        return _SumColumns(rows, [total.alias("inc"), counted], bad)
    aggregates = [counted]
    bad = F.lit(False)
    if declared.kind == "double":  # a NaN or an infinity is never stored, nor passed over
        odd = F.when(F.expr(not_storable(_VALUE, declared)), 1).otherwise(0)
        aggregates.append(F.sum(odd).alias(_ODD))
        bad = F.coalesce(F.col(_ODD), F.lit(0)) > 0
    if table.aggregate in ("min", "max"):
        extreme = F.min(_VALUE) if table.aggregate == "min" else F.max(_VALUE)
        return _SumColumns(rows, [extreme.alias("inc"), *aggregates], bad)
    return _last(table, rows, aggregates, bad)


def _last(
    table: CounterTable, rows: list[Column], aggregates: list[Column], bad: Column
) -> _SumColumns:
    """``last``: the value of the row with the greatest ``order_by`` (nulls: lowest), of
    the rows with a value. Two plain aggregates find it and check it is the only one:
    the greatest ``(order, value)`` and the greatest ``(order, -value)``; the rows at the
    greatest order agree when the two values are equal (``-value`` in a type wide
    enough for it)."""
    from pyspark.sql import functions as F

    declared = table.declared
    assert table.order_by is not None
    wide = "decimal(20,0)" if declared.kind == "long" else declared.sql
    value = F.col(_VALUE)
    negated = F.negative(value.cast(wide))
    rows = [*rows, F.col(table.order_by).alias(_ORDER), negated.alias(_NEGATED)]
    with_value = F.col(_VALUE).isNotNull()
    order = F.col(_ORDER).alias("o")
    high = F.max(F.when(with_value, F.struct(order, value.alias("v"))))
    low = F.max(F.when(with_value, F.struct(order, F.col(_NEGATED).alias("v"))))
    aggregates = [high.alias(_HIGH), low.alias(_LOW), *aggregates]
    ambiguous = F.coalesce(
        F.col(f"{_HIGH}.v").cast(wide) != F.negative(F.col(f"{_LOW}.v")), F.lit(False)
    )
    return _SumColumns(rows, aggregates, bad | ambiguous, F.col(f"{_HIGH}.v"))


def batch_sums(
    frame: DataFrame, table: CounterTable, key_types: dict[str, str]
) -> tuple[DataFrame, Column]:
    """``(keys..., inc, count)`` per key: the batch's sum in the declared type (null if
    it overflows it) and the count of non-null values; and the condition of a row whose
    sum cannot be stored. The value column holds the declared type exactly (checked
    before), so the cast to it changes no value. The columns are built once per table
    and key types (``transactional.columns.prebuilt``)."""
    key = (
        "batch_sums",
        table.name,
        tuple(table.keys),
        table.value,
        table.value_type,
        table.aggregate,
        table.order_by,
        tuple(sorted(key_types.items())),
    )
    c = prebuilt(frame, key, lambda: _sum_columns(table, key_types))
    sums = frame.select(*c.rows).groupBy(*table.keys).agg(*c.aggregates)
    if c.inc is not None:
        sums = sums.withColumn("inc", c.inc)
    # A key with no (non-null) value gets nothing: no row, whatever the aggregate.
    sums = sums.where(sums[_COUNT] > 0)
    return sums, c.bad


def checked_sums(sums: DataFrame, bad: Column, table: CounterTable) -> DataFrame:
    """``(keys..., inc)``; evaluating it fails with ``OVERFLOW_MARK`` if any row is bad."""
    from pyspark.sql import functions as F

    declared = table.declared
    fail = F.raise_error(F.lit(f"{OVERFLOW_MARK} table {table.name}"))
    inc = F.when(bad, fail).otherwise(F.coalesce(F.col("inc"), F.expr(zero(declared))))
    return sums.select(*table.keys, inc.cast(declared.sql).alias("inc"))


def diagnosed(find: Callable[[], list[Any]]) -> list[Any]:
    """The rows a failure-path query finds; none if it fails too (the error that led
    there is the one to report)."""
    try:
        return find()
    except Exception:
        log.warning("diagnosis query failed", exc_info=True)
        return []


def merge_overflows(
    spark: Any, location: str, source: DataFrame, table: CounterTable, opaque_txid: int | None
) -> list[Any]:
    """Up to five ``(keys..., stored, inc)`` rows whose stored value plus the batch's
    increment cannot be stored (the failure path of a MERGE). ``opaque_txid``: the
    txid of an opaque commit, whose rows of that txid are rebuilt from ``prev``."""
    from pyspark.sql import functions as F

    declared = table.declared
    base = f"t.`{table.column}`"
    if opaque_txid is not None:
        base = (
            f"CASE WHEN t.txid = {opaque_txid} THEN coalesce(t.prev, {zero(declared)}) "
            f"ELSE {base} END"
        )
    target = spark.read.format("delta").load(location)
    joined = target.alias("t").join(source.alias("s"), F.expr(keys_match(table.keys)))
    value = added(base, declared)
    return (
        joined.where(F.expr(not_storable(value, declared)))
        .select(
            *[F.col(f"s.`{k}`").alias(k) for k in table.keys], F.expr(base).alias("stored"), "s.inc"
        )
        .limit(5)
        .collect()
    )


def batch_overflow_error(
    who: str, txid: int | str, input_name: str, table: CounterTable, rows: list[Any]
) -> ContractError:
    """The error of a batch whose value for some key cannot be stored (``prepare``): a
    sum beyond the type, a NaN or infinite double, an undefined last value."""
    if table.combine == "sum":
        keys = "; ".join(
            f"{ {k: r[k] for k in table.keys} } sums to "
            f"{'beyond the type' if r['inc'] is None else r['inc']}"
            for r in rows
        )
    else:
        keys = "; ".join(f"{ {k: r[k] for k in table.keys} } {unstorable(table)}" for r in rows)
    return ContractError(
        f"{who}: txid {txid}, input {input_name!r}: counter table {table.name!r} "
        f"(value_type={table.value_type!r}) cannot store the batch: key {keys}. Nothing "
        "was committed; filter or fix those records in a bolt, or use a wider value_type "
        "for a new table"
    )


def merge_overflow_error(
    who: str, txid: int, location: str, table: CounterTable, rows: list[Any], done: list[str]
) -> ContractError:
    """The error of a MERGE whose stored value plus increment cannot be stored."""
    keys = "; ".join(
        f"key { {k: r[k] for k in table.keys} } (it holds {r['stored']}, adding {r['inc']})"
        for r in rows
    )
    held = (
        f"tables {done} already hold txid {txid} (each table commits on its own; "
        "DeltaCommitter.snapshot never shows a txid not every table holds)"
        if done
        else "no table holds it"
    )
    return ContractError(
        f"{who}: txid {txid}: Delta table {location} cannot store the new value of "
        f"{keys or 'a key (not found again)'}: beyond value_type={table.value_type!r}. The MERGE "
        f"wrote nothing to {table.name!r}; {held}. A sum is never stored wrapped or "
        "rounded: use a wider value_type for a new table"
    )
