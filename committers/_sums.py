"""A batch's per-key aggregates in Spark SQL, never narrowed: what both committers start a
commit from (``committers.counters.key_sums`` for Redis, the Delta committer's MERGE
source).

Spark's plain ``sum`` wraps a LONG overflow when ANSI mode is off, and rounds a decimal
sum to fewer decimals when ``spark.sql.decimalOperations.allowPrecisionLoss`` is on; a
double overflows to infinity in every mode. So every sum here is a ``try_`` function
(null on overflow, whatever the session's ANSI setting), cast back to the declared type
with ``try_cast`` (null if it does not fit), and the condition of a key whose value
cannot be stored comes with the sums for the committer to act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from committers.tables import CounterTable
from committers.values import ValueType
from transactional.spark.columns import prebuilt

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: The count of a key's non-null values in the batch sums.
COUNT_COLUMN = "__transactional_count"

#: Working columns of the batch sums; ``inc`` is reserved (``RESERVED_COLUMNS``), these
#: are named so that no key column is called the same.
_VALUE, _COUNT = "__transactional_value", COUNT_COLUMN


def not_storable(value: str, declared: ValueType) -> str:
    """SQL: true when ``value`` (already ``try_cast`` to the declared type) cannot be
    stored: null from an overflow, or for a double NaN or an infinity."""
    if declared.kind == "double":
        return f"(isnan({value}) OR abs({value}) = double('infinity'))"
    return f"(({value}) IS NULL)"


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
    and key types (``transactional.spark.columns.prebuilt``)."""
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
