"""How the bytes of a text file become records: line framing, decoding, and the
readers that run inside Spark tasks (``transactional.sources.files``).

The framing rule, which every line-framed source keeps:

- a line is the bytes up to a ``\\n``; one trailing ``\\r`` is stripped, so CRLF files
  read the same as LF files;
- a final line without ``\\n`` at end of file counts as a line too. A batch may
  therefore take a line that a writer is still in the middle of writing, so writers
  must append whole lines (one ``write`` of ``line + "\\n"``);
- bytes that are not valid UTF-8 do not stop anything: the record carries
  ``error = "invalid UTF-8"`` and a backslash-escaped decoding in ``raw``, so a bolt
  can send it to the dead letters with what was actually there.

Two readers keep that rule and give the same records for the same bytes: the range
reader (``read_file_splits``, Python in Spark tasks: any byte range of a file) and
Spark's own text reader (``read_text_files``, in the JVM: whole files only, and
cheaper, because no line passes through Python).

The range reader's functions are module-level and take only plain values, because
Spark pickles them by reference and runs them in executor processes.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc

from transactional.sources.text import INVALID_UTF8, RECORD_SCHEMA, text_records
from transactional.spark.storage import open_input
from transactional.spout import PARTITION_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The records of several partitions in one frame (a spout's ``emit_partitions``).
TAGGED_RECORD_SCHEMA = f"{RECORD_SCHEMA}, {PARTITION_COLUMN} INT"

_ARROW_SCHEMA = pa.schema([("raw", pa.string()), ("error", pa.string())])
#: Driver-side scans read this much per ``read``: counting b"\n" in big chunks is
#: what makes deciding a range cheap next to reading it.
_CHUNK = 1 << 20
#: Lines decoded per block: a block with a line that is not UTF-8 is decoded line by line.
_BLOCK = 1024


def decode_line(data: bytes) -> tuple[str, str | None]:
    """One line's bytes (without its ``\\n``) -> ``(raw, error)``."""
    if data.endswith(b"\r"):
        data = data[:-1]
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        return data.decode("utf-8", "backslashreplace"), INVALID_UTF8


def records_batch(lines: list[bytes]) -> pa.RecordBatch:
    """Decode lines (each without its ``\\n``) into one Arrow batch."""
    return _decoded(pa.array(lines, pa.large_binary()))


def records_from_bytes(data: bytes) -> pa.RecordBatch:
    """Bytes holding whole lines (the last may lack its ``\\n``: EOF) -> one Arrow batch.
    Split, validated and decoded by Arrow kernels: no Python object per line."""
    if not data:
        return _decoded(pa.array([], pa.large_binary()))
    joined = pa.array([data[:-1] if data.endswith(b"\n") else data], pa.large_binary())
    return _decoded(pc.split_pattern(joined, "\n").flatten())


def _decoded(lines: pa.Array) -> pa.RecordBatch:
    """Binary lines -> ``(raw, error)``, in blocks of ``_BLOCK`` lines: a block that is
    all valid UTF-8 is cast whole; one that is not is decoded line by line
    (``decode_line``), so a rare bad line costs its block, not the batch."""
    if len(lines) <= _BLOCK:
        return _decoded_block(lines)
    blocks = [_decoded_block(lines.slice(i, _BLOCK)) for i in range(0, len(lines), _BLOCK)]
    table = pa.Table.from_batches(blocks, schema=_ARROW_SCHEMA).combine_chunks()
    return table.to_batches()[0]


def _decoded_block(lines: pa.Array) -> pa.RecordBatch:
    try:
        raws = lines.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8 somewhere
        pairs = [decode_line(b) for b in lines.to_pylist()]
        return pa.RecordBatch.from_arrays(
            [
                pa.array([p[0] for p in pairs], pa.string()),
                pa.array([p[1] for p in pairs], pa.string()),
            ],
            schema=_ARROW_SCHEMA,
        )
    if pc.any(pc.ends_with(raws, "\r")).as_py():
        raws = pc.replace_substring_regex(raws, "\r$", "")
    return pa.RecordBatch.from_arrays(
        [raws, pa.nulls(len(raws), pa.string())], schema=_ARROW_SCHEMA
    )


def scan_lines(path: str, offset: int, max_lines: int) -> tuple[int, int]:
    """Find up to ``max_lines`` lines from byte ``offset``: returns ``(length, count)``.

    Runs on the driver for every new range, so it only counts newlines; it never
    decodes. Stops early at end of file, where a last line without ``\\n`` counts.
    """
    if max_lines <= 0:
        return 0, 0
    count = 0
    read = 0  # bytes read so far, relative to offset
    end = 0  # relative position just after the last line taken
    with open_input(path) as f:
        f.seek(offset)
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                if read > end:  # a final line without newline
                    count += 1
                    end = read
                return end, count
            need = max_lines - count
            found = chunk.count(b"\n")
            if found < need:
                if found:
                    end = read + chunk.rindex(b"\n") + 1
                count += found
                read += len(chunk)
                continue
            i = -1
            for _ in range(need):
                i = chunk.index(b"\n", i + 1)
            return read + i + 1, max_lines


def _line_start(f: BinaryIO, path: str, pos: int, start: int, end: int) -> int:
    """The first line start at or after ``pos`` within the range ``[start, end)``.

    Splitting a range at arbitrary byte positions and giving each line to the split
    where it starts (Hadoop's rule) lets one range be read by several tasks without
    the driver knowing where lines end.
    """
    if pos <= start:
        return start
    if pos >= end:
        return end
    at = pos - 1
    f.seek(at)
    while at < end:
        chunk = f.read(min(_CHUNK, end - at))
        if not chunk:
            raise OSError(f"{path}: ends at byte {at}, before {end}: was it truncated?")
        i = chunk.find(b"\n")
        if i >= 0:
            return at + i + 1
        at += len(chunk)
    return end


def read_file_split(path: str, start: int, end: int, lo: int, hi: int) -> pa.RecordBatch:
    """The records of the lines of range ``[start, end)`` of ``path`` that start in
    ``[lo, hi)``."""
    with open_input(path) as f:
        first = _line_start(f, path, lo, start, end)
        last = _line_start(f, path, hi, start, end)
        f.seek(first)
        data = f.read(last - first)
    if len(data) != last - first:
        raise OSError(f"{path}: ends before byte {last}: was it truncated or replaced?")
    return records_from_bytes(data)


def read_file_splits(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body over rows ``(path, start, end, lo, hi)``."""
    for batch in batches:
        for row in batch.to_pylist():
            yield read_file_split(row["path"], row["start"], row["end"], row["lo"], row["hi"])


def read_tagged_file_splits(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body over rows ``(partition, path, start, end, lo, hi)``: the
    records of each split with its partition number (``TAGGED_RECORD_SCHEMA``)."""
    for batch in batches:
        for row in batch.to_pylist():
            records = read_file_split(row["path"], row["start"], row["end"], row["lo"], row["hi"])
            tag = pa.array([row["partition"]] * records.num_rows, pa.int32())
            yield records.append_column(PARTITION_COLUMN, tag)


def file_splits(
    path: str, start: int, length: int, split_bytes: int
) -> list[tuple[str, int, int, int, int]]:
    """Rows for ``read_file_splits``: one task per ``split_bytes`` of the range."""
    end = start + length
    return [
        (path, start, end, lo, min(lo + split_bytes, end))
        for lo in range(start, end, max(1, split_bytes))
    ]


#: Paths Spark's reader takes literally: no glob characters, nothing URIs escape.
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9_./+=@,-]*")


def readable_by_spark(path: str) -> bool:
    """Whether ``read_text_files`` can take ``path`` as it is: an absolute local path
    (a file in a bucket is read by the range reader, which needs no Spark connector) of
    plain characters (Spark reads its arguments as glob patterns and Hadoop paths), no
    component of which Spark's file index would hide (``.name``, ``_name``)."""
    return bool(_PLAIN_PATH.fullmatch(path)) and not any(
        part.startswith((".", "_")) for part in path.split("/") if part
    )


def read_text_files(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """The records of whole files (``RECORD_SCHEMA``), read by Spark's text reader: the
    same records as the range reader gives for the same bytes (the framing rule above).

    Spark's reader hands each line over as its bytes, unchecked: lines are split at
    ``\\n`` only (``lineSep``; by default Spark also splits at a lone ``\\r``) and
    decoded by ``transactional.sources.text``. Paths must pass ``readable_by_spark``.
    """
    uris = [f"file://{p}" for p in paths]
    return text_records(spark.read.option("lineSep", "\n").text(uris), "value")


def find_lines(
    path: str, offset: int, length: int, wanted: Collection[str]
) -> dict[str, list[int]]:
    """The numbers (the file's first line is 1) of the lines in bytes ``[offset, offset +
    length)`` of ``path`` (``offset`` a line start) whose record's ``raw`` is one of
    ``wanted``, by text, in the file's order: the records a range reader gives, read
    again on the driver (``FileInput.locate``)."""
    found: dict[str, list[int]] = {}
    values = pa.array(list(wanted), pa.string())
    with open_input(path) as f:
        line = 1
        while f.tell() < offset:  # the lines before the range
            chunk = f.read(min(_CHUNK, offset - f.tell()))
            if not chunk:
                raise OSError(f"{path}: ends before byte {offset}: was it truncated?")
            line += chunk.count(b"\n")
        left, rest = length, b""
        while left:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                raise OSError(f"{path}: ends before byte {offset + length}: was it truncated?")
            left -= len(chunk)
            data, cut = rest + chunk, len(rest + chunk)
            if left:  # whole lines only; the rest waits for the next chunk
                cut = data.rfind(b"\n") + 1
            data, rest = data[:cut], data[cut:]
            if not data:
                continue
            raws = records_from_bytes(data).column(0)
            for i in pc.indices_nonzero(pc.is_in(raws, value_set=values)).to_pylist():
                found.setdefault(raws[i].as_py(), []).append(line + i)
            line += len(raws)
    return found


def at_line_start(path: str, offset: int) -> bool:
    """Whether byte ``offset`` (> 0) of the file at ``path`` follows a newline."""
    with open_input(path) as f:
        f.seek(offset - 1)
        return f.read(1) == b"\n"
