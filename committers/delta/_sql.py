"""The Delta committer's arithmetic in Spark SQL: a MERGE's additions, never narrowed.

As the batch sums (``committers._sums``), every addition here is a ``try_`` function
cast back to the declared type with ``try_cast`` (null if it does not fit), whatever the
session's ANSI setting, and a value that cannot be stored makes the job fail through
``raise_error`` carrying ``OVERFLOW_MARK``: the batch's checkpoint is never made, or the
MERGE commits nothing. Finding which keys overflowed costs a query, run only on that
failure path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from committers._sums import not_storable, zero
from committers.tables import CounterTable, unstorable
from committers.values import ValueType
from transactional.errors import ContractError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger("committers.delta")

#: Carried by the ``raise_error`` of a value that cannot be stored.
OVERFLOW_MARK = "transactional-value-out-of-range"


def keys_match(keys: tuple[str, ...]) -> str:
    # Null-safe: a null key must match its own row, or every txid would insert a new one.
    return " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in keys)


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
    rows: list[Any] = (
        joined.where(F.expr(not_storable(value, declared)))
        .select(
            *[F.col(f"s.`{k}`").alias(k) for k in table.keys], F.expr(base).alias("stored"), "s.inc"
        )
        .limit(5)
        .collect()
    )
    return rows


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
