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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from committers.counters import CounterTable
from committers.values import exact_sum
from transactional.errors import CommitError
from transactional.types import CommitMode

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

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


def arrow_writable(dt: DeltaTable) -> bool:
    """Whether this path may write the table: one without deletion vectors or column
    mapping (reader version 1), whose writer features delta-rs supports (writer version
    up to 4). The committer's own tables are (1, 2); any other goes through Spark."""
    protocol = dt.protocol()
    return protocol.min_reader_version == 1 and protocol.min_writer_version <= 4


def null_sums_as_zero(sums: pa.Table) -> pa.Table:
    """A null ``inc`` that was not refused is a key whose values were all null: 0."""
    import pyarrow as pa
    import pyarrow.compute as pc

    inc = sums.column("inc")
    filled = pc.fill_null(inc, pa.scalar(_zero_of(inc.type), inc.type))
    return sums.set_column(sums.schema.get_field_index("inc"), "inc", filled)


def keys_match(keys: Sequence[str]) -> str:
    # Null-safe, as on the Spark path: a null key matches its own row.
    return " AND ".join(f"(t.{quoted(k)} IS NOT DISTINCT FROM s.{quoted(k)})" for k in keys)


def merge_counts(
    dt: DeltaTable,
    table: CounterTable,
    sums: pa.Table,
    txid: int,
    mode: CommitMode,
    marker: tuple[str, int],
) -> None:
    """Add ``sums`` (``(keys..., inc)``, one row per key) into ``dt`` for ``txid``, in
    one commit carrying ``marker`` (app id, version). Raises ``Unstorable`` (nothing
    written) when a new value does not fit the declared type."""
    from deltalake.transaction import CommitProperties, Transaction

    schema = _arrow_schema(dt)
    keys = list(table.keys)
    source = _cast(sums.select([*keys, "inc"]), schema, {**{k: k for k in keys}, "inc": "count"})
    opaque = mode is CommitMode.OPAQUE
    target = _target(dt, schema, table, source, txid if opaque else None)
    rows = _opaque_rows(table, source, target, txid) if opaque else _rows(table, source, target)
    rows = _cast(rows, schema, {c: c for c in rows.column_names if c in schema.names})
    app_id, version = marker
    merger = dt.merge(
        rows,
        keys_match(keys),
        source_alias="s",
        target_alias="t",
        streamed_exec=False,  # an in-memory source: let delta-rs prune files by its keys
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id, version)]),
    )
    values = ["count", "prev", "txid"] if opaque else ["count"]
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
    dt: DeltaTable, rows: pa.Table, txid: int, mode: CommitMode, marker: tuple[str, int]
) -> None:
    """Append a txid's dead letters ``(raw, reason, txid)``, carrying ``marker``; in
    opaque mode replace that txid's rows in the same commit, so a replay whose bad
    records differ leaves exactly its own."""
    import pyarrow as pa
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties, Transaction

    schema = _arrow_schema(dt)
    app_id, version = marker
    properties = CommitProperties(app_transactions=[Transaction(app_id, version)])
    data = rows.cast(pa.schema([schema.field(n) for n in rows.column_names]))
    if mode is CommitMode.OPAQUE:
        write_deltalake(
            dt, data, mode="overwrite", predicate=f"txid = {txid}", commit_properties=properties
        )
    else:
        write_deltalake(dt, data, mode="append", commit_properties=properties)


def _arrow_schema(dt: DeltaTable) -> pa.Schema:
    import pyarrow as pa

    return pa.schema(dt.schema().to_arrow())


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


# -- reading what the batch touches ----------------------------------------------------


def _encoded_keys(data: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, list[str]]:
    """``data`` plus, per key, its value with nulls filled and an is-null flag: Arrow's
    joins never match nulls, and a null key must match its own row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = []
    for i, key in enumerate(keys):
        column = data.column(key)
        filler = pa.scalar(_zero_of(column.type), column.type)
        data = data.append_column(f"__k{i}", pc.fill_null(column, filler))
        data = data.append_column(f"__n{i}", pc.is_null(column))
        names += [f"__k{i}", f"__n{i}"]
    return data, names


def _zero_of(arrow_type: pa.DataType) -> Any:
    import datetime
    from decimal import Decimal

    import pyarrow as pa

    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return ""
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return b""
    if pa.types.is_boolean(arrow_type):
        return False
    if pa.types.is_decimal(arrow_type):
        return Decimal(0)
    if pa.types.is_date(arrow_type):
        return datetime.date(1970, 1, 1)
    if pa.types.is_floating(arrow_type):
        return 0.0
    return 0  # integers, and timestamps (their epoch)


def _target(
    dt: DeltaTable, schema: pa.Schema, table: CounterTable, source: pa.Table, own: int | None
) -> pa.Table:
    """The table's rows that may match a batch key (pruned on the first key column),
    and with ``own`` (opaque) every row that txid wrote."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    # The snapshot's files read as plain Parquet in the table's own types, filtered
    # batch by batch as they are read (a filter given to the scan would be compared with
    # the files' statistics, which delta-rs writes as string_view: pyarrow cannot). The
    # committer's tables have neither deletion vectors nor column mapping
    # (``arrow_writable``), so their files hold exactly their rows.
    columns = [*table.keys, "count"]
    if own is not None:
        columns += ["prev", "txid"]
    dataset = ds.dataset(dt.file_uris(), schema=schema, format="parquet")
    first = table.keys[0]
    condition = ds.field(first).isin(source.column(first).drop_null())
    if source.column(first).null_count:
        condition = condition | ds.field(first).is_null()
    if own is not None:
        condition = condition | (ds.field("txid") == own)
    batches = [
        batch.filter(condition) for batch in dataset.to_batches(columns=columns, batch_size=1 << 16)
    ]
    return pa.Table.from_batches(batches, pa.schema([schema.field(c) for c in columns]))


def _joined(source: pa.Table, target: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Each batch key with what the table holds for it (``t_*`` columns, null: none)."""
    left, names = _encoded_keys(source, keys)
    right, _ = _encoded_keys(target, keys)
    right = right.drop_columns(list(keys))
    right = right.rename_columns([n if n in names else f"t_{n}" for n in right.column_names])
    return left.join(right, names, join_type="left outer").drop_columns(names)


# -- the new values ---------------------------------------------------------------------


def _rows(table: CounterTable, source: pa.Table, target: pa.Table) -> pa.Table:
    """Transactional: ``(keys..., count)`` with ``count = stored + inc``."""
    joined = _joined(source, target, table.keys)
    base = joined.column("t_count")
    count = _added(table, joined, base)
    return joined.select(list(table.keys)).append_column("count", count)


def _opaque_rows(table: CounterTable, source: pa.Table, target: pa.Table, txid: int) -> pa.Table:
    """Opaque: ``(keys..., count, prev, txid, op)`` for every batch key, and an undo row
    for each row ``txid`` wrote before that this attempt no longer has."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = list(table.keys)
    joined = _joined(source, target, keys)
    held = joined.column("t_txid")
    ahead = pc.any(pc.greater(held, txid)).as_py()
    if ahead:
        raise CommitError(
            f"table {table.name!r} holds rows of a txid after {txid}: the sink is ahead of "
            "the state store"
        )
    own = pc.fill_null(pc.equal(held, txid), False)
    base = pc.if_else(own, joined.column("t_prev"), joined.column("t_count"))
    count = _added(table, joined, base)
    n = joined.num_rows
    upserts = joined.select(keys).append_column("count", count)
    upserts = upserts.append_column("prev", base)
    upserts = upserts.append_column("txid", pa.array([txid] * n, pa.int64()))
    upserts = upserts.append_column(_OP, pa.array([_UPSERT] * n, pa.string()))
    # Rows of this txid that the batch no longer has.
    mine = target.filter(pc.equal(target.column("txid"), txid))
    if mine.num_rows == 0:
        return upserts
    enc_mine, names = _encoded_keys(mine, keys)
    enc_source, _ = _encoded_keys(source.select(keys), keys)
    gone = enc_mine.join(enc_source.drop_columns(keys), names, join_type="left anti")
    gone = gone.drop_columns(names)
    created = pc.is_null(gone.column("prev"))
    m = gone.num_rows
    # A deleted row's count is never written: it keeps its own (non-null) value.
    restored = pc.if_else(created, gone.column("count"), gone.column("prev"))
    undo = gone.select(keys).append_column("count", restored)
    undo = undo.append_column("prev", pa.nulls(m, gone.schema.field("prev").type))
    undo = undo.append_column("txid", pa.array([0] * m, pa.int64()))
    undo = undo.append_column(_OP, pc.if_else(created, _DELETE, _UPSERT).cast(pa.string()))
    return pa.concat_tables([upserts, undo.cast(upserts.schema)])


def _added(table: CounterTable, joined: pa.Table, base: pa.ChunkedArray) -> pa.ChunkedArray:
    """``base + inc`` (a null base: 0) in the declared type, or ``Unstorable``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    inc = joined.column("inc")
    declared = table.declared
    start = pc.fill_null(base, pa.scalar(_zero_of(inc.type), inc.type))
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
