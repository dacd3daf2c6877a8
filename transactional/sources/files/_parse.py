"""Text records into typed columns, in Spark SQL: a JSON Lines or CSV record parsed
with the source's schema, where a record that does not fit keeps going with its text
and an ``error`` (for a bolt to send to the dead letters), never dropped and never
silently changed.

Parsing is Spark's own (``from_json``, ``from_csv``) in ``PERMISSIVE`` mode with a
corrupt-record column: a record Spark could not read whole (bad JSON, a value of
another type, a number out of its type's range) has every column null and an
``error``; so has a CSV line with more or fewer fields than the schema.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from transactional.errors import ConfigurationError, SourceSchemaError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

__all__ = ["RESERVED", "check_header", "check_names", "parsed", "struct"]

#: Columns a parsed record adds after the schema's: a schema must not use them.
RESERVED = ("raw", "error")
#: The corrupt-record column between parsing and the projection.
_CORRUPT = "__transactional_corrupt"
_PARSED = "__transactional_parsed"


def struct(schema: str | StructType, who: str, text: bool) -> StructType:
    """``schema`` (a DDL string or a ``StructType``) as a ``StructType``; needs the
    session (a DDL string is parsed by Spark). ``text``: the schema of parsed text
    records, which must leave ``raw`` and ``error`` free."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    if isinstance(schema, StructType):
        result = schema
    else:
        try:
            given = _parse_datatype_string(schema)
        except Exception as e:  # Spark's ParseException, by its Python or JVM name
            raise ConfigurationError(
                f"{who}: schema {schema!r} is not a DDL schema "
                f"('account STRING, amount LONG'): {str(e).splitlines()[0]}"
            ) from e
        if not isinstance(given, StructType):
            raise ConfigurationError(
                f"{who}: schema {schema!r} is one type, not columns: name them ('value STRING')"
            )
        result = given
    if not result.fields:
        raise ConfigurationError(f"{who}: schema has no column")
    if text:
        check_names(result, who)
    return result


def check_names(schema: StructType, who: str) -> None:
    taken = [f.name for f in schema.fields if f.name in RESERVED or f.name.startswith("__")]
    if taken:
        raise ConfigurationError(
            f"{who}: the schema's column {', '.join(map(repr, taken))} would hide the "
            f"record's own {', '.join(RESERVED)} (or the framework's __ columns): rename it"
        )


def parsed(
    records: DataFrame,
    format: str,
    schema: StructType,
    options: Mapping[str, str],
    keep: Sequence[str] = (),
) -> DataFrame:
    """``records`` (``raw, error`` text records, after the ``keep`` columns) as the
    schema's columns, then ``raw, error``: ``error`` is the record's own (invalid UTF-8)
    or says that the record does not fit the schema, and then every column is null."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    wide = StructType([*schema.fields, StructField(_CORRUPT, StringType())])
    settings = {**options, "mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
    if format == "csv":
        # RFC 4180: a quote inside a quoted value is doubled (Spark's default escapes it
        # with a backslash, and leaves a doubled quote unread).
        settings.setdefault("escape", options.get("quote", '"'))
    raw = F.col("raw")
    if format == "csv":
        value, what = F.from_csv(raw, _ddl(wide), settings), "a CSV record of the schema"
    else:
        value, what = F.from_json(raw, wide, settings), "a JSON object of the schema"
    record = F.col(_PARSED)
    error = F.coalesce(
        F.col("error"),
        F.when(
            record.isNull() | record[_CORRUPT].isNotNull(),
            F.lit(f"not {what} ({_ddl(schema)})"),
        ),
        _rounded(raw, record, format, schema, settings, f"not {what} ({_ddl(schema)}): "),
    )
    ok = F.col("error").isNull()
    return (
        records.select(*keep, "raw", "error", value.alias(_PARSED))
        .select(*keep, "raw", record, error.alias("error"))
        .select(
            *keep,
            *(F.when(ok, record[f.name]).alias(f.name) for f in schema.fields),
            "raw",
            "error",
        )
    )


def _rounded(
    raw: Column,
    record: Column,
    format: str,
    schema: StructType,
    settings: Mapping[str, str],
    prefix: str,
) -> Column:
    """An error for a record whose decimal value has more places than its column's
    scale: Spark rounds it to the scale without a word, and a value silently changed is
    what a source must never give. Each decimal is read again as text (a second parse
    with those columns as STRING; for JSON, the member's text) and its places counted."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DecimalType, StringType, StructField, StructType

    decimals = [f for f in schema.fields if isinstance(f.dataType, DecimalType)]
    if not decimals:
        return F.lit(None).cast("string")
    if format == "csv":
        texts = StructType(
            [
                StructField(f.name, StringType()) if isinstance(f.dataType, DecimalType) else f
                for f in schema.fields
            ]
        )
        as_text = F.from_csv(raw, _ddl(texts), settings)
        text_of = {f.name: as_text[f.name] for f in decimals}
    else:
        text_of = {f.name: F.get_json_object(raw, f"$['{f.name}']") for f in decimals}
    checks = []
    for field in decimals:
        assert isinstance(field.dataType, DecimalType)
        text, parsed_value = text_of[field.name], record[field.name]
        places = F.regexp_replace(F.regexp_extract(text, r"\.([0-9]*)", 1), "0+$", "")
        exact = text.try_cast("decimal(38,18)")
        changed = parsed_value.isNotNull() & (
            (F.length(places) > field.dataType.scale)
            | (exact.isNotNull() & (exact != parsed_value))
        )
        checks.append(
            F.when(
                changed,
                F.concat(
                    F.lit(f"{prefix}{field.name} "),
                    text,
                    F.lit(f" has more decimal places than {field.dataType.simpleString()} holds"),
                ),
            )
        )
    return F.coalesce(*checks)


def _ddl(schema: StructType) -> str:
    return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in schema.fields)


def check_header(
    who: str, path: str, line: bytes, schema: StructType, options: Mapping[str, str]
) -> None:
    """A CSV file's header ``line`` must name the schema's columns, in its order."""
    delimiter = options.get("sep", options.get("delimiter", ","))
    quote = options.get("quote", '"')
    try:
        found = next(csv.reader([line.decode("utf-8")], delimiter=delimiter, quotechar=quote))
    except (UnicodeDecodeError, csv.Error, StopIteration) as e:
        raise SourceSchemaError(f"{who}: the header of {path} cannot be read ({e})") from e
    wanted = [f.name for f in schema.fields]
    if [name.strip() for name in found] != wanted:
        raise SourceSchemaError(
            f"{who}: the header of {path} names the columns {found}, but the source's "
            f"schema has {wanted}: write files with the schema's columns in its order, or "
            "pass the schema the files have"
        )
