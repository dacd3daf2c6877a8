"""Reading the Delta tables the committer writes through delta-rs as plain Parquet, with
pyarrow: a whole table (``read_table``), the values of some keys (``lookup``) and the
rows a batch's keys may touch (``target_rows``, what a MERGE computes new values from).

This is exact only for tables without deletion vectors or column mapping
(``arrow_writable``): their snapshot's files hold exactly their rows. Any other table is
refused here and read with Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from committers.delta._location import local_dir
from committers.tables import CounterTable
from transactional.errors import ConfigurationError

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

__all__ = [
    "arrow_schema",
    "arrow_writable",
    "encoded_keys",
    "lookup",
    "read_table",
    "readable",
    "target_rows",
    "with_stored",
    "zero_of",
]

#: The position of a looked-up key in the caller's list (``lookup``).
_ORDINAL = "__transactional_ordinal"


def arrow_writable(dt: DeltaTable) -> bool:
    """Whether this path may write the table: one without deletion vectors or column
    mapping (reader version 1), whose writer features delta-rs supports (writer version
    up to 4). The committer's own tables are (1, 2); any other goes through Spark."""
    protocol = dt.protocol()
    return protocol.min_reader_version == 1 and protocol.min_writer_version <= 4


def read_table(location: str, columns: Sequence[str]) -> pa.Table:
    """``columns`` of the latest version of a table the committer wrote (no deletion
    vectors, no column mapping: ``arrow_writable``), read as plain Parquet."""

    dt = readable(location)
    return files(dt, arrow_schema(dt)).to_table(columns=columns)


def lookup(location: str, table: CounterTable, keys: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The values the latest version of ``table``'s Delta table at ``location`` holds
    for ``keys`` (None: no row), in their order. Each key column's given values are
    cast to the column's type (a text such as ``"2024-05-01"`` or ``"7"`` becomes the
    date or the integer; a cast that cannot be made raises ``ValueError``)."""
    import pyarrow as pa

    dt = readable(location)
    schema = arrow_schema(dt)
    columns: dict[str, Any] = {}
    for i, key in enumerate(table.keys):
        given = [k[i] for k in keys]
        target = schema.field(key).type
        try:
            columns[key] = pa.array(given).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError) as exc:
            raise ValueError(
                f"key column {key!r} of {location} is {target}: {given!r} cannot be read "
                f"as that ({exc})"
            ) from None
    columns[_ORDINAL] = pa.array(range(len(keys)), pa.int64())
    wanted = pa.table(columns)
    target = target_rows(dt, schema, table, wanted, None)
    # A left join keeps every row of ``wanted`` (a key asked twice is two), not their order.
    joined = with_stored(wanted, target, table.keys).sort_by(_ORDINAL)
    values: list[Any] = joined.column(f"t_{table.column}").to_pylist()
    return values


def readable(location: str) -> DeltaTable:
    """The latest version of a table this module reads as plain Parquet
    (``arrow_writable``), or why not."""
    from deltalake import DeltaTable

    dt = DeltaTable(location)
    if not arrow_writable(dt):
        raise ConfigurationError(
            f"Delta table {location} uses table features this reader does not apply "
            "(deletion vectors or column mapping): read it with Spark"
        )
    return dt


def files(dt: DeltaTable, schema: pa.Schema, condition: Any = None) -> Any:
    """The snapshot's files as a pyarrow dataset of plain Parquet in the table's own
    types; with ``condition`` (a pyarrow expression), only the files whose Delta
    statistics (each file's min, max and null count in the log, as delta-rs attaches
    them to its fragments) say may hold a row it matches. Scan the result without a
    filter and filter its batches: a filter in the scan would also be compared with the
    Parquet files' own statistics, which delta-rs writes as string_view, and pyarrow
    cannot compare those with a string."""
    import pyarrow.dataset as ds
    import pyarrow.fs as pa_fs

    # A local table is read with pyarrow's own file system (delta-rs's, which honours
    # storage options, calls back into Python for every read: twice as slow here).
    local = local_dir(dt.table_uri)
    filesystem = None
    if local is not None:
        filesystem = pa_fs.SubTreeFileSystem(str(local), pa_fs.LocalFileSystem())
    every = dt.to_pyarrow_dataset(schema=schema, filesystem=filesystem)
    if condition is None:
        return every
    kept = list(every.get_fragments(filter=condition))
    return ds.FileSystemDataset(kept, every.schema, every.format, every.filesystem)


def arrow_schema(dt: DeltaTable) -> pa.Schema:
    import pyarrow as pa

    return pa.schema(dt.schema().to_arrow())


def target_rows(
    dt: DeltaTable, schema: pa.Schema, table: CounterTable, source: pa.Table, own: int | None
) -> pa.Table:
    """The table's rows that may match a batch key (pruned on the first key column),
    and with ``own`` (opaque) every row stamped ``own`` or above (written by an earlier
    attempt of the txid or group starting at ``own``)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    # The committer's tables have neither deletion vectors nor column mapping
    # (``arrow_writable``), so their files hold exactly their rows: the files the
    # condition may match (``files``), filtered batch by batch as they are read.
    columns = [*table.keys, table.column]
    if own is not None:
        columns += ["prev", "txid"]
    first = table.keys[0]
    # One array, not the chunked column: a batch with no rows has no chunks, and
    # pyarrow would take a value set of no chunks for one of type null.
    condition = ds.field(first).isin(source.column(first).drop_null().combine_chunks())
    if source.column(first).null_count:
        condition = condition | ds.field(first).is_null()
    if own is not None:
        condition = condition | (ds.field("txid") >= own)
    dataset = files(dt, schema, condition)
    batches = [
        batch.filter(condition) for batch in dataset.to_batches(columns=columns, batch_size=1 << 16)
    ]
    return pa.Table.from_batches(batches, pa.schema([schema.field(c) for c in columns]))


def with_stored(source: pa.Table, target: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Each batch key with what the table holds for it (``t_*`` columns, null: none)."""
    left, names = encoded_keys(source, keys)
    right, _ = encoded_keys(target, keys)
    right = right.drop_columns(list(keys))
    right = right.rename_columns([n if n in names else f"t_{n}" for n in right.column_names])
    return left.join(right, names, join_type="left outer").drop_columns(names)


def encoded_keys(data: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, list[str]]:
    """``data`` plus, per key, its value with nulls filled and an is-null flag: Arrow's
    joins never match nulls, and a null key must match its own row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = []
    for i, key in enumerate(keys):
        column = data.column(key)
        filler = pa.scalar(zero_of(column.type), column.type)
        data = data.append_column(f"__k{i}", pc.fill_null(column, filler))
        data = data.append_column(f"__n{i}", pc.is_null(column))
        names += [f"__k{i}", f"__n{i}"]
    return data, names


def zero_of(arrow_type: pa.DataType) -> Any:
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
