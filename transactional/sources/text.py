"""Bytes into text records, in Spark SQL: the rule every ready-made source applies to a
line or a message, so that a bad one is never dropped nor silently changed.

A record is ``(raw STRING, error STRING)``:

- one trailing ``\\r`` is removed (CRLF text reads as LF text);
- bytes that are valid UTF-8 are ``raw``, with ``error`` null;
- bytes that are not keep going: ``error`` is ``"invalid UTF-8"`` and ``raw`` is the
  bytes decoded as Python's ``decode("utf-8", "backslashreplace")`` does (each
  well-formed sequence as its character, each other byte as ``\\xNN``), so a dead
  letter shows what was actually there.

It runs in the JVM (no row passes through Python) and gives exactly what the demo's
Python range reader gives for the same bytes (``transactional.sources.files._lines``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from transactional.spark.columns import prebuilt

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["INVALID_UTF8", "RECORD_SCHEMA", "text_records"]

#: The schema of a text record.
RECORD_SCHEMA = "raw STRING, error STRING"
INVALID_UTF8 = "invalid UTF-8"

#: One byte as it appears in ``hex()``: a continuation byte of a UTF-8 sequence.
_CONT = "[89AB][0-9A-F]"
#: The well-formed UTF-8 byte sequences (Unicode Table 3-7), over ``hex()``'s digits.
_WELL_FORMED = "|".join(
    (
        "[0-7][0-9A-F]",
        f"(?:C[2-9A-F]|D[0-9A-F]){_CONT}",
        f"E0[AB][0-9A-F]{_CONT}",
        f"E[1-9A-CEF]{_CONT}{_CONT}",
        f"ED[89][0-9A-F]{_CONT}",
        f"F0(?:9[0-9A-F]|[AB][0-9A-F]){_CONT}{_CONT}",
        f"F[1-3]{_CONT}{_CONT}{_CONT}",
        f"F48[0-9A-F]{_CONT}{_CONT}",
    )
)
#: A record's bytes in hex, cut into well-formed sequences and single stray bytes.
_SEQUENCES = f"({_WELL_FORMED}|..)"
#: The column holding a record's line between the two projections.
_LINE = "__transactional_line"


def text_records(
    frame: DataFrame,
    column: str,
    keep: Sequence[str] = (),
    absent: str | None = None,
    kept_last: bool = False,
) -> DataFrame:
    """``frame``'s ``column`` (STRING or BINARY: one record's bytes per row, unchecked)
    as text records ``raw, error``, after the columns named in ``keep`` (``kept_last``:
    before them). ``absent``: the ``error`` of a row whose ``column`` is null (a Kafka
    record without a value)."""
    key = ("text_records", column, absent)
    line, raw, error = prebuilt(frame, key, partial(_built, column, absent))
    records: tuple[Column | str, ...] = (raw, error, *keep) if kept_last else (*keep, raw, error)
    return frame.select(*keep, line).select(*records)


def _built(column: str, absent: str | None) -> tuple[Column, Column, Column]:
    """``text_records``' columns: built once per session (``transactional.spark.columns``),
    they cost more round trips to the JVM than the two projections using them."""
    from pyspark.sql import functions as F

    # A STRING from Spark's text reader or a cast BINARY holds the bytes as they came;
    # endswith and octet_length work on bytes, and the cut goes through BINARY, because
    # a character-wise substring of bytes that are not UTF-8 would decode them first.
    text = F.col(f"`{column}`").cast("string")
    cut = f"substring(cast(`{column}` AS BINARY), 1, octet_length(`{column}`) - 1)"
    line = F.when(text.endswith("\r"), F.expr(cut).cast("string")).otherwise(text)
    valid = F.is_valid_utf8(F.col(_LINE))
    error = F.when(~valid, F.lit(INVALID_UTF8))
    if absent is not None:
        error = F.when(F.col(_LINE).isNull(), F.lit(absent)).otherwise(error)
    return (
        line.alias(_LINE),
        F.when(valid, F.col(_LINE)).otherwise(_escaped(F.col(_LINE))).alias("raw"),
        error.alias("error"),
    )


def _escaped(line: Column) -> Column:
    """``line``'s bytes decoded with backslash escapes, in SQL: costly, but only bad
    records take it."""
    from pyspark.sql import functions as F

    tokens = F.regexp_extract_all(F.hex(line.cast("binary")), F.lit(_SEQUENCES), 1)
    decoded = F.transform(
        tokens,
        lambda t: F.when(
            (F.length(t) > 2) | (t < F.lit("80")), F.unhex(t).cast("string")
        ).otherwise(F.concat(F.lit("\\x"), F.lower(t))),
    )
    return F.array_join(decoded, "")
