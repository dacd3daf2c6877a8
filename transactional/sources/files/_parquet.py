"""Parquet files by row range: the footer asked on the driver (row counts, schema), the
rows read in Spark tasks by ``pyarrow``, only the row groups a range touches.

A Parquet file is written whole (its footer last), so a file that is still being
written cannot be read: writers must write under a hidden name (``.name`` or
``_name``, which the file source skips) and rename the finished file.

The task functions are module-level and take only plain values, because Spark pickles
them by reference and runs them in executor processes.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from transactional.errors import ConfigurationError, EmitError, SourceSchemaError
from transactional.sources.base import split_frame
from transactional.spark.storage import arrow_file_system
from transactional.spout import PARTITION_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: The columns of a split row: the file, its rows ``[lo, hi)``, the Arrow schema of
#: the rows to give (``pa.Schema.serialize``), and the partition to tag them with
#: (-1: none).
SPLIT_SCHEMA = "path STRING, lo LONG, hi LONG, schema BINARY, partition INT"


def row_count(path: str) -> int:
    """Rows in ``path`` (a local path or an S3 URL), from its footer alone."""
    fs, inside = arrow_file_system(path)
    return int(pq.ParquetFile(inside, filesystem=fs).metadata.num_rows)


def file_schema(path: str) -> pa.Schema:
    fs, inside = arrow_file_system(path)
    return pq.read_schema(inside, filesystem=fs)


def spark_schema(schema: pa.Schema) -> StructType:
    """``schema`` as Spark's; ``TypeError`` for a type Spark cannot hold."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema of ``mapInArrow``'s output for Spark's ``schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    # A TimestampType column holds instants: Arrow's UTC microseconds.
    return to_arrow_schema(schema, timezone="UTC")


def schema_of(who: str, path: str) -> StructType:
    """The Spark schema of the file at ``path``."""
    try:
        return spark_schema(file_schema(path))
    except (TypeError, ValueError) as e:
        raise ConfigurationError(
            f"{who}: the columns of {path} have a type Spark cannot hold ({e}): pass "
            "schema= with the columns to read"
        ) from e
    except OSError as e:
        raise EmitError(f"{who}: {path} is not a readable Parquet file ({e})") from e


def check_columns(who: str, path: str, schema: StructType, strict: bool) -> None:
    """The file at ``path`` must hold every column of ``schema`` (each cast on read,
    safely) and, when ``strict`` (the schema is the first file's, not the user's
    choice), no other: a column left out silently would be a change nobody chose."""
    try:
        found = file_schema(path)
    except (OSError, ValueError) as e:
        raise EmitError(f"{who}: {path} is not a readable Parquet file ({e})") from e
    wanted = [f.name for f in schema.fields]
    missing = [n for n in wanted if n not in found.names]
    extra = [n for n in found.names if n not in wanted] if strict else []
    if missing or extra:
        raise SourceSchemaError(
            f"{who}: {path} has the columns {', '.join(found.names)}, but the source reads "
            f"{', '.join(wanted)}"
            + (f" (missing: {', '.join(missing)})" if missing else "")
            + (f" (not in the schema: {', '.join(extra)})" if extra else "")
            + ": write files with the same columns, pass schema= with the columns to "
            "read, or start a new topology id for the new layout"
        )


def splits(
    path: str, start: int, count: int, split_rows: int, schema: bytes, partition: int = -1
) -> list[tuple[str, int, int, bytes, int]]:
    """Rows for ``read_splits``: one task per ``split_rows`` rows of ``[start, start + count)``."""
    end = start + count
    step = max(1, split_rows)
    return [(path, lo, min(lo + step, end), schema, partition) for lo in range(start, end, step)]


def read_range(path: str, lo: int, hi: int, schema: pa.Schema) -> pa.Table:
    """Rows ``[lo, hi)`` of ``path``, cast to ``schema`` (safely: a value the cast would
    change, a timestamp's nanoseconds or an integer out of range, fails the task)."""
    fs, inside = arrow_file_system(path)
    parquet = pq.ParquetFile(inside, filesystem=fs)
    meta = parquet.metadata
    if meta.num_rows < hi:
        raise OSError(f"{path} holds {meta.num_rows} rows, not the {hi} a batch refers to")
    groups: list[int] = []
    first = None  # the row number of the first group read
    at = 0
    for group in range(meta.num_row_groups):
        rows = meta.row_group(group).num_rows
        if at < hi and at + rows > lo:
            groups.append(group)
            first = at if first is None else first
        at += rows
    if not groups or first is None:
        return schema.empty_table()
    table = parquet.read_row_groups(groups, columns=schema.names).slice(lo - first, hi - lo)
    return table.select(schema.names).cast(schema, safe=True)


def find_rows(
    path: str, lo: int, hi: int, schema: pa.Schema, wanted: Sequence[Mapping[str, Any]]
) -> list[list[int]]:
    """For each of ``wanted`` (a row's values, as Spark gives them to Python), the
    numbers (the file's first row is 1) of the rows ``[lo, hi)`` of ``path`` that hold
    the same values in each column of a scalar type (nested ones are not compared), read
    as ``read_range`` reads them, a row group at a time (``FileInput.locate``)."""
    columns = [f.name for f in schema if not pa.types.is_nested(f.type)]
    places: dict[tuple[Any, ...], list[int]] = {}
    keys = [_key(row, columns) for row in wanted]
    for key in keys:
        places.setdefault(key, [])
    fs, inside = arrow_file_system(path)
    meta = pq.ParquetFile(inside, filesystem=fs).metadata
    at = 0
    for group in range(meta.num_row_groups):
        first, last = max(lo, at), min(hi, at + meta.row_group(group).num_rows)
        at += meta.row_group(group).num_rows
        if first >= last:
            continue
        rows = read_range(path, first, last, schema).select(columns).to_pylist()
        for n, row in enumerate(rows, start=first + 1):
            found = places.get(_key(row, columns))
            if found is not None:
                found.append(n)
    return [places[key] for key in keys]


def _key(row: Mapping[str, Any], columns: Sequence[str]) -> tuple[Any, ...]:
    """A row's values, comparable whichever side read them: an instant as UTC (Spark
    gives a local time without a zone, Arrow a UTC one), bytes as bytes, NaN as itself."""

    def plain(value: Any) -> Any:
        if isinstance(value, dt.datetime):
            return value.astimezone(dt.UTC)  # a time without a zone: the local one's
        if isinstance(value, bytearray):
            return bytes(value)
        if isinstance(value, float) and math.isnan(value):
            return "NaN"
        return value

    return tuple(plain(row.get(c)) for c in columns)


def read_splits(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body over ``SPLIT_SCHEMA`` rows: each split's rows in its schema,
    followed by its partition number when it has one (``emit_partitions``)."""
    for batch in batches:
        for row in batch.to_pylist():
            schema = pa.ipc.read_schema(pa.py_buffer(row["schema"]))
            table = read_range(row["path"], row["lo"], row["hi"], schema)
            if row["partition"] >= 0:
                tag = pa.array([row["partition"]] * table.num_rows, pa.int32())
                table = table.append_column(PARTITION_COLUMN, tag)
            yield from table.to_batches()


def read_frame(
    spark: SparkSession,
    schema: StructType,
    ranges: Sequence[tuple[str, int, int, int]],
    split_rows: int,
    tasks: int | None = None,
) -> DataFrame:
    """A lazy frame of the ``(path, first row, rows, partition)`` ranges, a task per
    ``split_rows`` rows, in ``schema``'s columns; with ``tasks`` (``emit_partitions``)
    spread over that many tasks and each row tagged with its partition."""
    shipped = arrow_schema(schema).serialize().to_pybytes()
    rows = [
        row
        for path, offset, count, partition in ranges
        for row in splits(path, offset, count, split_rows, shipped, partition)
    ]
    output = schema
    if tasks is not None:
        from pyspark.sql.types import IntegerType, StructField, StructType

        output = StructType([*output.fields, StructField(PARTITION_COLUMN, IntegerType())])
    return split_frame(spark, rows, SPLIT_SCHEMA, read_splits, tasks, output)
