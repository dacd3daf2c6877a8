"""Setting up Delta for the committer: the Spark settings that load it, and creating
or checking each table, so that a wrong path, mode or type fails at open rather than
at the first commit."""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from committers.delta._location import local_dir, sql_name
from committers.keys import parse_key_type, supported, why_unsupported
from committers.tables import VALUE_COLUMNS, CounterTable
from transactional.errors import ConfigurationError
from transactional.spark.connect import client_only
from transactional.spark.jars import DEFAULT_IVY_DIR, session_jars

__all__ = ["DEFAULT_IVY_DIR", "brief", "check_table_types", "delta_spark_conf", "ensure_table"]


def delta_spark_conf(ivy_dir: str | Path | None = None) -> dict[str, str]:
    """Spark settings that load Delta; pass them to ``create_spark_session``.

    The Maven coordinate follows ``delta.pip_utils.configure_spark_with_delta_pip``
    (artifact suffixed with pyspark's major.minor), but as plain conf so it can be merged
    with other settings and used by any session builder.
    """
    import pyspark

    settings = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # The default (50) makes every snapshot of a tiny table cost 50 tasks.
        "spark.databricks.delta.snapshotPartitions": "2",
    }
    if client_only():  # a Connect server's: Delta's jar is its own
        return settings
    try:
        delta_version = importlib.metadata.version("delta-spark")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigurationError(
            "Delta on a Spark session in this process needs delta-spark, whose version "
            "names the Delta jar the driver loads: pip install 'transactional-spark[delta]'"
        ) from None
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    package = f"io.delta:delta-spark_{spark_minor}_2.13:{delta_version}"
    # Resolved once, quietly, into a cache of our own (transactional.spark.jars); sessions load
    # the jars directly instead of asking Ivy, which prints its report at every start.
    jars = session_jars([package], ivy_dir or DEFAULT_IVY_DIR)
    return {"spark.jars": ",".join(str(jar) for jar in jars), **settings}


def brief(exc: BaseException) -> str:
    """The first line of a (py4j) error: the Java stack stays on the chained cause."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return lines[0][:400]


def ensure_table(
    spark: Any,
    location: str,
    columns: list[tuple[str, str, bool]],
    explain: Callable[[str, dict[str, str]], str | None] | None = None,
) -> dict[str, str]:
    """Create the table at ``location`` if missing; its columns' Spark types by name.
    An existing table without one of ``columns`` is refused, with why from ``explain``
    (given the location and the table's columns; None: a general message).

    A table of plain types is created and read with delta-rs, in milliseconds, on a
    local disk or in S3; delta-spark took 1.5 s per table warm and 8 s for the demo's
    four on a cold session (benchmarks/analysis.md). Other types go through delta-spark. Either
    way the table is a plain Delta table (reader 1, writer 2) that both read."""
    try:
        schema = _ensure_with_delta_rs(location, columns)
        if schema is None:
            schema = _ensure_with_spark(spark, location, columns)
    except ConfigurationError:
        raise
    except Exception as exc:
        raise ConfigurationError(
            f"cannot create or read the Delta table at {location}: {brief(exc)}. Check "
            "that the path is writable and, if a table exists there, that it is a Delta table."
        ) from exc
    missing = [name for name, _, _ in columns if name not in schema]
    if missing:
        why = None if explain is None else explain(location, schema)
        if why is not None:
            raise ConfigurationError(why)
        raise ConfigurationError(
            f"Delta table {location} lacks column(s) {missing} (it has {sorted(schema)}): "
            "it was created for another configuration or mode; use a new path"
        )
    return schema


def _ensure_with_spark(
    spark: Any, location: str, columns: list[tuple[str, str, bool]]
) -> dict[str, str]:
    """``ensure_table`` through delta-spark, in SQL (which a Spark Connect server runs
    without Delta's own Connect plugin)."""
    declared = ", ".join(
        f"`{name}` {sql_type}{'' if nullable else ' NOT NULL'}"
        for name, sql_type, nullable in columns
    )
    spark.sql(f"CREATE TABLE IF NOT EXISTS {sql_name(location)} ({declared}) USING delta").collect()
    fields = spark.read.format("delta").load(location).schema.fields
    return {f.name: f.dataType.simpleString() for f in fields}


#: Spark's type names (``simpleString``) as Delta's, for the types delta-rs creates here
#: (and ``decimal(p,s)``, named alike in both).
_DELTA_NAMES = {
    "string": "string",
    "bigint": "long",
    "int": "integer",
    "smallint": "short",
    "tinyint": "byte",
    "boolean": "boolean",
    "double": "double",
    "float": "float",
    "date": "date",
    "binary": "binary",
}
_SPARK_NAMES = {delta: spark for spark, delta in _DELTA_NAMES.items()}
_DECIMAL = re.compile(r"^decimal\(\d+,\d+\)$")


def _ensure_with_delta_rs(
    location: str, columns: list[tuple[str, str, bool]]
) -> dict[str, str] | None:
    """``ensure_table`` through delta-rs, on a local disk or in an S3 bucket; None where
    it does not apply (a type this module does not map, or a table with such a type)."""
    from deltalake import DeltaTable, Field, Schema
    from deltalake.schema import PrimitiveType

    path = local_dir(location)
    types = [t for _, sql_type, _ in columns if (t := _delta_name(sql_type)) is not None]
    if len(types) < len(columns):
        return None
    if not _is_table(location):
        if path is not None and path.exists() and any(path.iterdir()):
            raise ConfigurationError(
                f"cannot create the Delta table at {location}: the directory holds files "
                "but no Delta table (no _delta_log). Use an empty or new path."
            )
        fields = [
            Field(name, PrimitiveType(t), nullable=nullable)
            for (name, _, nullable), t in zip(columns, types, strict=True)
        ]
        try:
            DeltaTable.create(location, Schema(fields), mode="ignore")
        except Exception:
            if not _is_table(location):  # not a race with another creator
                raise
    schema: dict[str, str] = {}
    for found in DeltaTable(location).schema().fields:
        name = found.type.type if isinstance(found.type, PrimitiveType) else ""
        spark_name = name if _DECIMAL.match(name) else _SPARK_NAMES.get(name)
        if spark_name is None:
            return None  # a type read back through delta-spark, which names it exactly
        schema[found.name] = spark_name
    return schema


def _is_table(location: str) -> bool:
    from deltalake import DeltaTable

    path = local_dir(location)
    if path is not None:
        return (path / "_delta_log").exists()
    return DeltaTable.is_deltatable(location)


def _delta_name(sql_type: str) -> str | None:
    """``sql_type`` as Delta names it, if delta-rs creates it here."""
    try:
        name = parse_key_type(sql_type)
    except ValueError:
        return None
    return name if _DECIMAL.match(name) else _DELTA_NAMES.get(name)


def open_counter_table(
    who: str, spark: Any, location: str, table: CounterTable, opaque: bool
) -> dict[str, str]:
    """Create ``table``'s Delta table at ``location`` if missing, else check that it
    fits (its mode's columns, the declared types); its key columns' types by name."""
    sql = table.declared.sql
    columns = [(k, table.key_types.get(k, "string"), True) for k in table.keys]
    columns.append((table.column, sql, False))
    if opaque:
        columns += [("prev", sql, True), ("txid", "LONG", False)]
    schema = ensure_table(spark, location, columns, explain=partial(_other_aggregate, who, table))
    if not opaque and "txid" in schema:
        raise ConfigurationError(
            f"Delta table {location} has opaque-mode columns but {who} is in "
            "transactional mode; use a new path"
        )
    check_table_types(who, location, table, schema, opaque)
    return {k: schema[k] for k in table.keys}


def _other_aggregate(
    who: str, table: CounterTable, location: str, schema: dict[str, str]
) -> str | None:
    """Why a table holding another aggregate's column cannot keep ``table``."""
    held = [c for c in VALUE_COLUMNS if c in schema and c != table.column]
    if table.column in schema or not held:
        return None
    kept = "sums or counts" if held[0] == "count" else f"the {held[0]}"
    return (
        f"Delta table {location} keeps {kept} (column {held[0]!r}), but {who} declares "
        f"table {table.name!r} as aggregate {table.aggregate!r}: use a new table (values "
        "are never converted in place)"
    )


def check_table_types(
    who: str, location: str, table: CounterTable, schema: dict[str, str], opaque: bool
) -> None:
    """An existing table keeps its types: values are never converted in place, and a
    key type the MERGE cannot match exactly would merge or split keys."""
    for column in (table.column, "prev") if opaque else (table.column,):
        if schema[column] != table.declared.sql:
            raise ConfigurationError(
                f"Delta table {location} stores {column!r} as {schema[column]}, but "
                f"{who} declares value_type={table.value_type!r} ({table.declared.sql}) "
                "for it: declare the table's type, or use a new table for the new type "
                "(values are never converted in place)"
            )
    for key in table.keys:
        if not supported(schema[key], "delta"):
            raise ConfigurationError(
                f"Delta table {location} key column {key!r} is {schema[key]}, which {who} "
                f"cannot match exactly: {why_unsupported(schema[key])}"
            )
        declared = table.key_types.get(key)
        if declared is not None and declared != schema[key]:
            raise ConfigurationError(
                f"Delta table {location} key column {key!r} is {schema[key]}, but counter "
                f"table {table.name!r} declares key_types[{key!r}]={declared!r}: declare "
                "the table's type, or use a new table"
            )
