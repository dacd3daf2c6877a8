"""The Redis committer's per-field sums as Arrow tables ``(field, inc)``: the key columns
encoded into Redis fields by Arrow kernels (``committers.keys.encode_key``'s encoding),
the sums' texts for the commit script, and a commit group's sums added per field.

On the common path (keys of strings, integers, booleans or dates; LONG sums) no Python
object is made per key until the script's argument is built: at 100,000 keys a txid,
per-key Python (tuples, dicts, ``str``) cost the driver about 0.7 s of the 2-core
machine's time that Spark needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from committers._sums import COUNT_COLUMN
from committers.counters import BAD_COLUMN, VALUES_COLUMN, combined_values, per_key_sums
from committers.keys import ESCAPE, NULL_FIELD, SEPARATOR, decode_key, encode_key
from committers.tables import CounterTable, Number, unstorable
from committers.values import ValueType, exact_sum, fsum
from transactional.errors import ContractError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["FIELD", "INC", "added", "collected_fields", "encode_fields", "fields_table", "texts"]

#: The columns of a hash's sums: the Redis field (the encoded key) and its increment.
FIELD, INC = "field", "inc"


def encode_fields(data: pa.Table, keys: Sequence[str]) -> pa.ChunkedArray:
    """Each row's Redis field: ``encode_key`` of its key columns' texts, computed with
    Arrow kernels. A column's text is Arrow's cast to string, which writes what
    ``committers.keys.key_text`` does for every Redis key type (integers in decimal,
    ``true``/``false``, ISO dates); a property test holds the two equal."""
    import pyarrow as pa
    import pyarrow.compute as pc

    several = len(keys) > 1
    parts = []
    for key in keys:
        text = pc.cast(data.column(key), pa.large_string())
        text = pc.replace_substring(text, ESCAPE, ESCAPE + ESCAPE)
        if several:
            text = pc.replace_substring(text, SEPARATOR, ESCAPE + SEPARATOR)
        parts.append(pc.fill_null(text, NULL_FIELD))
    if not several:
        return parts[0]
    return pc.binary_join_element_wise(*parts, pa.scalar(SEPARATOR, pa.large_string()))


def collected_fields(
    sums: pa.Table, frame: Callable[[], DataFrame], table: CounterTable
) -> tuple[pa.Table, list[str]]:
    """``committers.counters.key_sums``'s rows, collected, as one hash's fields: the
    table ``(field, inc)`` of exact sums (keys with no non-null value left out), and the
    keys whose sum cannot be stored, each with why. A sum Spark found unstorable is
    explained by ``per_key_sums`` over ``frame()``, the input (a second job, on that
    failure path only, the only one that asks for the frame)."""
    import pyarrow.compute as pc

    declared = table.declared
    if table.aggregate == "sum" and declared.kind == "double":
        return _double_fields(sums, table)
    if table.combine != "sum":
        bad = sums.filter(sums.column(BAD_COLUMN))
        if bad.num_rows:
            keys = bad.select(list(table.keys)).slice(0, 5).to_pylist()
            return _table([], []), [f"{key} {unstorable(table)}" for key in keys]
        return _table(encode_fields(sums, table.keys), sums.column("inc")), []
    if pc.any(sums.column(BAD_COLUMN)).as_py():
        found, refused = per_key_sums(frame(), table)
        return fields_table({encode_key(k): v for k, v in found.items()}, declared), refused
    kept = sums.filter(pc.greater(sums.column(COUNT_COLUMN), 0))
    return _table(encode_fields(kept, table.keys), kept.column("inc")), []


def _double_fields(sums: pa.Table, table: CounterTable) -> tuple[pa.Table, list[str]]:
    """Doubles are added on the driver with ``math.fsum`` (``exact_sum``), one list of
    values per key, as Spark cannot add them exactly."""
    fields, totals, refused = [], [], []
    encoded = encode_fields(sums, table.keys).to_pylist()
    for field, values in zip(encoded, sums.column(VALUES_COLUMN).to_pylist(), strict=True):
        if not values:
            continue
        try:
            totals.append(exact_sum(values, table.declared))
        except ValueError as exc:
            key = dict(zip(table.keys, decode_key(field, len(table.keys)), strict=True))
            refused.append(f"{key} {exc}")
        else:
            fields.append(field)
    return fields_table(dict(zip(fields, totals, strict=True)), table.declared), refused


def fields_table(sums: Mapping[str, Number], declared: ValueType | None = None) -> pa.Table:
    """A hash's sums given in Python (field -> sum) as the ``(field, inc)`` table:
    LONG sums as int64 (decimal128(38,0) past 64 bits), doubles as float64, decimals as
    Arrow infers them. ``declared`` None: by the values' Python types."""
    import pyarrow as pa

    values = list(sums.values())
    kind = declared.kind if declared is not None else _kind(values)
    if kind == "double":
        inc = pa.array([float(v) for v in values], pa.float64())
    elif kind == "long":
        try:
            inc = pa.array(values, pa.int64())
        except (OverflowError, pa.ArrowInvalid):
            inc = pa.array([Decimal(int(v)) for v in values], pa.decimal128(38, 0))
    else:
        inc = pa.array([Decimal(v) for v in values])
    return _table(pa.array(list(sums), pa.large_string()), inc)


def _kind(values: Iterable[Any]) -> str:
    kinds = {type(v) for v in values}
    if float in kinds:
        return "double"
    return "decimal" if Decimal in kinds else "long"


def _table(fields: Any, inc: Any) -> pa.Table:
    import pyarrow as pa

    return pa.table({FIELD: fields, INC: inc})


def texts(sums: pa.Table, declared: ValueType) -> tuple[list[str], list[str]]:
    """The fields and the increments as the script reads them: LONG as plain digits
    (Arrow's cast), a double as the shortest text that reads back as it, a decimal as
    plain digits with its exact scale (a group's total may pass the declared precision:
    only the new stored value must fit, which the script checks)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    inc = sums.column(INC)
    if declared.kind == "long":
        increments = pc.cast(inc, pa.string()).to_pylist()
    elif declared.kind == "double":
        increments = [repr(float(v)) for v in inc.to_pylist()]
    else:
        increments = [format(v, "f") for v in inc.to_pylist()]
    return sums.column(FIELD).to_pylist(), increments


def added(table: CounterTable, parts: Sequence[pa.Table], who: str, last: int) -> pa.Table:
    """The values of a commit group's txids for ``table``'s hash, combined per field:
    the smaller, the greater or the last txid's value (``min``, ``max``, ``last``); sums
    and counts added exactly:
    LONG in decimal128(38,0) and decimals in decimal256 (kept wide: the script checks
    the stored result), doubles with ``math.fsum`` (a total beyond the largest double is
    a ``ContractError``)."""
    import pyarrow as pa

    if len(parts) == 1:
        return parts[0]
    declared = table.declared
    if table.combine != "sum":  # min, max, or the last part's (parts are in txid order)
        data = pa.concat_tables(parts, promote_options="default")
        return combined_values(data, [FIELD], INC, table.combine)
    if declared.kind == "double":
        data = pa.concat_tables(parts)
        grouped = data.group_by(FIELD, use_threads=False).aggregate([(INC, "list")])
        totals = [fsum(v) for v in grouped.column(f"{INC}_list").to_pylist()]
        for field, total in zip(grouped.column(FIELD).to_pylist(), totals, strict=True):
            if not math.isfinite(total):
                key = decode_key(field, len(table.keys))
                raise ContractError(
                    f"{who}: Redis hash {table.name!r} cannot store the group ending at "
                    f"txid {last}: the increments of key {key} sum beyond the largest "
                    "double. Nothing was committed; use a wider value_type for a new hash"
                )
        return _table(grouped.column(FIELD), pa.array(totals, pa.float64()))
    wide = pa.decimal128(38, 0) if declared.kind == "long" else pa.decimal256(76, declared.scale)
    data = pa.concat_tables([_table(p.column(FIELD), p.column(INC).cast(wide)) for p in parts])
    grouped = data.group_by(FIELD, use_threads=False).aggregate([(INC, "sum")])
    return _table(grouped.column(FIELD), grouped.column(f"{INC}_sum"))
