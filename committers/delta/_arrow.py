"""The Delta committer's commit path on the driver: a txid's per-key sums, already
collected as Arrow, merged into a table by the ``deltalake`` package (delta-rs), with the
txid marker in the same commit (``CommitProperties(app_transactions=...)``, the ``txn``
action delta-spark's ``txnAppId``/``txnVersion`` write).

The new values are computed here, not in the MERGE: the rows the batch touches are read
from the snapshot the MERGE then commits against, the sums are added with checked Arrow
arithmetic in the declared type (DataFusion's ``+`` wraps a LONG and gives a double
infinity without a word), and the MERGE only sets the values it is given. A write that
raced ours on the same table fails the commit (delta-rs's conflict check against that
snapshot), which a retry then redoes on fresh data.

Opaque mode: each row keeps ``(count, prev, txid)``. A batch key the table holds from an
earlier txid gets ``prev = count, count += inc``; one that txid ``t`` wrote before is
rebuilt from its ``prev``; a row ``t`` wrote that the new attempt no longer has is
undone (deleted if ``t`` created it, else ``count = prev, txid = 0``).

A commit group ``first..t`` (``combined_sums`` adds its txids' sums, exactly) is one
MERGE marked with ``t``; in opaque mode every row stamped ``first`` or above was written
by an earlier attempt of this group (``first`` is the state store's ``currtx``), so
those rows are what is rebuilt or undone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from committers.counters import combined_values
from committers.delta._parquet import arrow_schema, encoded_keys, target_rows, with_stored, zero_of
from committers.tables import CounterTable
from committers.values import exact_sum, fsum
from transactional.errors import CommitError
from transactional.types import CommitMode

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from deltalake.transaction import CommitProperties

#: The source column of an opaque MERGE saying what to do with the row.
_OP = "transactional_op"
_UPSERT, _DELETE = "u", "d"


class Unstorable(ValueError):
    """Sums a table cannot store: ``rows`` holds up to five ``(key, stored, inc)``."""

    def __init__(self, rows: list[tuple[dict[str, Any], Any, Any]]) -> None:
        super().__init__(f"{len(rows)} unstorable sums")
        self.rows = rows


def quoted(column: str) -> str:
    """A column name as delta-rs's SQL reads it, whatever characters it holds."""
    return "`" + column.replace("`", "``") + "`"


def keys_match(keys: Sequence[str]) -> str:
    # Null-safe, as on the Spark path: a null key matches its own row.
    return " AND ".join(f"(t.{quoted(k)} IS NOT DISTINCT FROM s.{quoted(k)})" for k in keys)


def combined_sums(parts: Sequence[pa.Table], table: CounterTable) -> pa.Table:
    """The per-key sums ``(keys..., inc)`` of the txids of a commit group, added
    exactly: LONG and decimals wide (decimal128(38,0), decimal256), cast back with a
    safe cast; doubles with ``math.fsum`` per key. A total the declared type cannot
    hold raises ``Unstorable`` (its stored value unknown: None)."""
    import math

    import pyarrow as pa

    keys = list(table.keys)
    data = pa.concat_tables([p.select([*keys, "inc"]) for p in parts], promote_options="default")
    inc = data.column("inc")
    declared = table.declared
    if table.combine != "sum":  # min, max, or the last part's (parts are in txid order)
        return combined_values(data, keys, "inc", table.combine)
    if declared.kind == "double":
        grouped = data.group_by(keys, use_threads=False).aggregate([("inc", "list")])
        totals = [fsum(v) for v in grouped.column("inc_list").to_pylist()]
        summed = pa.array(totals, inc.type)
        if any(not math.isfinite(v) for v in totals):
            raise Unstorable(_rows_where(grouped, keys, summed, lambda v: not math.isfinite(v)))
        return grouped.select(keys).append_column("inc", summed)
    wide = pa.decimal128(38, 0) if declared.kind == "long" else pa.decimal256(76, declared.scale)
    data = data.set_column(data.schema.get_field_index("inc"), "inc", inc.cast(wide))
    grouped = data.group_by(keys, use_threads=False).aggregate([("inc", "sum")])
    total = grouped.column("inc_sum")
    try:
        narrowed = total.cast(inc.type)
    except (pa.ArrowInvalid, OverflowError):
        raise Unstorable(_rows_where(grouped, keys, total, _beyond(inc.type))) from None
    return grouped.select(keys).append_column("inc", narrowed)


def _beyond(arrow_type: pa.DataType) -> Any:
    import pyarrow as pa

    def does_not_fit(value: Any) -> bool:
        try:
            pa.array([value]).cast(arrow_type)
        except (pa.ArrowInvalid, OverflowError):
            return True
        return False

    return does_not_fit


def _rows_where(
    grouped: pa.Table, keys: list[str], totals: Any, bad: Any
) -> list[tuple[dict[str, Any], Any, Any]]:
    found = []
    for row, total in zip(grouped.select(keys).to_pylist(), totals.to_pylist(), strict=True):
        if bad(total):
            found.append((row, None, total))
            if len(found) == 5:
                break
    return found


def _empty_sums(schema: pa.Schema, table: CounterTable) -> pa.Table:
    """No sums (every txid of a group came out empty), in the table's types."""
    import pyarrow as pa

    fields = [schema.field(k) for k in table.keys] + [schema.field(table.column).with_name("inc")]
    return pa.schema(fields).empty_table()


def merge_counts(
    dt: DeltaTable,
    table: CounterTable,
    sums: pa.Table | None,
    span: tuple[int, int],
    mode: CommitMode,
    marker: tuple[str, int],
    note: str | None = None,
) -> None:
    """Add ``sums`` (``(keys..., inc)``, one row per key; None: none) into ``dt`` for
    the txids ``span`` (``(first, last)``: one txid, or a commit group), in one commit
    carrying ``marker`` (app id, version) and ``note`` (its ``userMetadata``). Raises
    ``Unstorable`` (nothing written) when a new value does not fit the declared type."""
    schema = arrow_schema(dt)
    keys = list(table.keys)
    sums = _empty_sums(schema, table) if sums is None else sums
    value = table.column
    source = _cast(sums.select([*keys, "inc"]), schema, {**{k: k for k in keys}, "inc": value})
    opaque = mode is CommitMode.OPAQUE
    first, txid = span
    target = target_rows(dt, schema, table, source, first if opaque else None)
    if opaque:
        rows = _opaque_rows(table, source, target, first, txid)
    else:
        rows = _rows(table, source, target)
    rows = _cast(rows, schema, {c: c for c in rows.column_names if c in schema.names})
    merger = dt.merge(
        rows,
        keys_match(keys),
        source_alias="s",
        target_alias="t",
        streamed_exec=False,  # an in-memory source: let delta-rs prune files by its keys
        commit_properties=commit_properties(marker, note),
    )
    values = [value, "prev", "txid"] if opaque else [value]
    updates = {quoted(c): f"s.{quoted(c)}" for c in values}
    inserts = {quoted(c): f"s.{quoted(c)}" for c in [*keys, *values]}
    if opaque:
        upsert, delete = f"s.{_OP} = '{_UPSERT}'", f"s.{_OP} = '{_DELETE}'"
        merger = merger.when_matched_delete(predicate=delete)
        merger = merger.when_matched_update(updates, predicate=upsert)
        merger = merger.when_not_matched_insert(inserts, predicate=upsert)
    else:
        merger = merger.when_matched_update(updates).when_not_matched_insert(inserts)
    merger.execute()


def write_dead_letters(
    dt: DeltaTable,
    rows: pa.Table | None,
    first: int,
    mode: CommitMode,
    marker: tuple[str, int],
    note: str | None = None,
) -> None:
    """Append the dead letters ``(raw, reason, txid)`` of the txids from ``first`` (one
    txid, or a commit group; None: none), carrying ``marker`` and ``note``; in opaque
    mode replace the rows of those txids in the same commit, so a replay whose bad
    records differ leaves exactly its own."""
    import pyarrow as pa
    from deltalake import write_deltalake

    schema = arrow_schema(dt)
    properties = commit_properties(marker, note)
    if rows is None:
        rows = schema.empty_table()
    data = rows.cast(pa.schema([schema.field(n) for n in rows.column_names]))
    if mode is CommitMode.OPAQUE:
        write_deltalake(
            dt, data, mode="overwrite", predicate=f"txid >= {first}", commit_properties=properties
        )
    else:
        write_deltalake(dt, data, mode="append", commit_properties=properties)


def _cast(data: pa.Table, schema: pa.Schema, names: dict[str, str]) -> pa.Table:
    """``data``'s columns cast to the table's types (``names``: column -> table column):
    large and small strings, time zones and nullability differ between Spark's Arrow and
    delta-rs's; a cast that would change a value raises."""
    import pyarrow as pa

    fields = []
    for f in data.schema:
        target = schema.field(names[f.name]).type if f.name in names else f.type
        fields.append(pa.field(f.name, target, nullable=True))
    return data.cast(pa.schema(fields))


# -- the new values ---------------------------------------------------------------------


def _rows(table: CounterTable, source: pa.Table, target: pa.Table) -> pa.Table:
    """Transactional: ``(keys..., value)`` with the new value (``stored + inc`` for a
    sum)."""
    joined = with_stored(source, target, table.keys)
    base = joined.column(f"t_{table.column}")
    value = _added(table, joined, base)
    return joined.select(list(table.keys)).append_column(table.column, value)


def _opaque_rows(
    table: CounterTable, source: pa.Table, target: pa.Table, first: int, txid: int
) -> pa.Table:
    """Opaque: ``(keys..., count, prev, txid, op)`` for every batch key, and an undo row
    for each row an earlier attempt of the txids ``first..txid`` wrote that this attempt
    no longer has."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = list(table.keys)
    joined = with_stored(source, target, keys)
    held = joined.column("t_txid")
    ahead = pc.any(pc.greater(held, txid)).as_py()
    if ahead:
        raise CommitError(
            f"table {table.name!r} holds rows of a txid after {txid}: the sink is ahead of "
            "the state store"
        )
    own = pc.fill_null(pc.greater_equal(held, first), False)
    column = table.column
    base = pc.if_else(own, joined.column("t_prev"), joined.column(f"t_{column}"))
    value = _added(table, joined, base)
    n = joined.num_rows
    upserts = joined.select(keys).append_column(column, value)
    upserts = upserts.append_column("prev", base)
    upserts = upserts.append_column("txid", pa.array([txid] * n, pa.int64()))
    upserts = upserts.append_column(_OP, pa.array([_UPSERT] * n, pa.string()))
    # Rows of these txids that the batch no longer has.
    mine = target.filter(pc.greater_equal(target.column("txid"), first))
    if mine.num_rows == 0:
        return upserts
    enc_mine, names = encoded_keys(mine, keys)
    enc_source, _ = encoded_keys(source.select(keys), keys)
    gone = enc_mine.join(enc_source.drop_columns(keys), names, join_type="left anti")
    gone = gone.drop_columns(names)
    created = pc.is_null(gone.column("prev"))
    m = gone.num_rows
    # A deleted row's count is never written: it keeps its own (non-null) value.
    restored = pc.if_else(created, gone.column(column), gone.column("prev"))
    undo = gone.select(keys).append_column(column, restored)
    undo = undo.append_column("prev", pa.nulls(m, gone.schema.field("prev").type))
    undo = undo.append_column("txid", pa.array([0] * m, pa.int64()))
    undo = undo.append_column(_OP, pc.if_else(created, _DELETE, _UPSERT).cast(pa.string()))
    return pa.concat_tables([upserts, undo.cast(upserts.schema)])


def _added(table: CounterTable, joined: pa.Table, base: pa.ChunkedArray) -> pa.ChunkedArray:
    """The new value from the stored one (``base``; null: none) and the batch's ``inc``
    by the table's aggregate: for a sum, ``base + inc`` (a null base: 0) in the declared
    type, or ``Unstorable``; the smaller or greater of the two; the batch's."""
    import pyarrow as pa
    import pyarrow.compute as pc

    inc = joined.column("inc")
    if table.combine == "last":
        return inc
    if table.combine in ("min", "max"):
        extreme = pc.min_element_wise if table.combine == "min" else pc.max_element_wise
        return extreme(base.cast(inc.type), inc, skip_nulls=True)
    declared = table.declared
    start = pc.fill_null(base, pa.scalar(zero_of(inc.type), inc.type))
    try:
        if declared.kind == "double":
            total = pc.add(start, inc)
            if not pc.all(pc.is_finite(total)).as_py():
                raise pa.ArrowInvalid("a sum is not finite")
            return total
        if declared.kind == "decimal":  # added wide (a decimal128(38,s) sum is 39 digits)
            wide = pa.decimal256(declared.precision, declared.scale)
            return pc.add_checked(start.cast(wide), inc.cast(wide)).cast(inc.type)
        return pc.add_checked(start, inc)
    except (pa.ArrowInvalid, OverflowError):
        raise Unstorable(_unstorable(table, joined, base)) from None


def _unstorable(
    table: CounterTable, joined: pa.Table, base: pa.ChunkedArray
) -> list[tuple[dict[str, Any], Any, Any]]:
    """The failure path: which keys' new values cannot be stored (up to five)."""
    found = []
    stored = base.to_pylist()
    for i, row in enumerate(joined.select([*table.keys, "inc"]).to_pylist()):
        try:
            exact_sum([stored[i] or 0, row["inc"]], table.declared)
        except ValueError:
            found.append(({k: row[k] for k in table.keys}, stored[i], row["inc"]))
            if len(found) == 5:
                break
    return found


def commit_properties(marker: tuple[str, int], note: str | None = None) -> CommitProperties:
    """delta-rs' properties of a commit carrying ``marker`` (an app transaction: app id,
    version) and, when given, ``note`` as the commit's ``userMetadata``."""
    from deltalake.transaction import CommitProperties, Transaction

    app_id, version = marker
    metadata = None if note is None else {"userMetadata": note}
    return CommitProperties(
        app_transactions=[Transaction(app_id, version)], custom_metadata=metadata
    )
