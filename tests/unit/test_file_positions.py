"""Where a file spout's record sits (``FileInput.locate``, asked by the ledger once a
txid failed): each record's file and line (a Parquet file's row), found again on the
driver in the txid's ranges, against line numbers counted here from the bytes written;
a text found on several lines named by all of them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from transactional.sources.files import (
    FileRange,
    FileSequenceMeta,
    FilesPartitionedSpout,
    FilesTransactionalSpout,
)
from transactional.sources.files._lines import find_lines
from transactional.sources.files._parquet import find_rows
from transactional.spout import SpoutContext


def write(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def whole(root: Path, name: str) -> FileRange:
    size = (root / name).stat().st_size
    count = (root / name).read_bytes().count(b"\n")
    return FileRange(file=name, offset=0, length=size, count=count)


def test_lines_are_numbered_from_the_start_of_the_file_whatever_the_range(tmp_path: Path) -> None:
    lines = [b"head", b"a", b"b\r", b"\xffbad", b"a", b"c", b"a"]
    path = tmp_path / "f.jsonl"
    write(path, lines)
    offset = len(b"head\n") + len(b"a\n")  # the range starts at "b"
    length = path.stat().st_size - offset - len(b"a\n")  # and leaves the last "a" out
    found = find_lines(str(path), offset, length, {"a", "b", "\\xffbad", "nowhere"})
    # Numbers from 1 at the file's first byte; CR dropped, bad UTF-8 escaped, as a batch reads.
    assert found == {"b": [3], "\\xffbad": [4], "a": [5]}


def test_a_line_longer_than_a_read_is_found(tmp_path: Path) -> None:
    long = b"x" * (3 << 20)  # longer than a driver read (1 MiB)
    path = tmp_path / "f.jsonl"
    write(path, [b"a", long, b"a"])
    size = path.stat().st_size
    assert find_lines(str(path), 0, size, {long.decode(), "a"}) == {"a": [1, 3], long.decode(): [2]}


def test_a_partitioned_batch_names_file_and_line_and_every_line_of_a_repeated_text(
    tmp_path: Path,
) -> None:
    write(tmp_path / "a.jsonl", [b"one", b"twice", b"x", b"x", b"twice", b"x", b"x"])
    write(tmp_path / "b c.jsonl", [b"twice", b"alone"])
    spout = FilesPartitionedSpout(tmp_path)
    meta = {1: whole(tmp_path, "b c.jsonl"), 0: whole(tmp_path, "a.jsonl")}
    records: list[dict[str, Any]] = [
        {"raw": "alone", "error": None},
        {"raw": "one", "error": None},
        {"raw": "twice", "error": None},
        {"raw": "x", "error": None},
        {"raw": "not there", "error": None},
        {"raw": None, "error": None},
    ]
    assert spout.locate(1, meta, records) == [
        "file 'b c.jsonl' line 2",
        "file a.jsonl line 1",
        "file a.jsonl line 2, 5 or file 'b c.jsonl' line 1 (same text)",
        "file a.jsonl line 3, 4, 6 or 1 more (same text)",
        None,
        None,
    ]


def test_a_sequence_batch_counts_lines_from_each_file_start_a_header_among_them(
    tmp_path: Path,
) -> None:
    header = b"user,n"
    write(tmp_path / "p-0.csv", [header, b"ann,1", b"bob,2", b"cy,3"])
    write(tmp_path / "p-1.csv", [header, b"dee,4"])
    spout = FilesTransactionalSpout(
        tmp_path, format="csv", schema="user STRING, n INT", header=True
    )
    # The txid took the last line of p-0.csv and the data of p-1.csv.
    skip = len(b"user,n\nann,1\nbob,2\n")
    segments = (
        FileRange(file="p-0.csv", offset=skip, length=len(b"cy,3\n"), count=1),
        FileRange(file="p-1.csv", offset=len(b"user,n\n"), length=len(b"dee,4\n"), count=1),
    )
    meta = FileSequenceMeta(segments=segments, file="p-1.csv", offset=len(b"user,n\ndee,4\n"))
    records = [{"user": "dee", "n": 4, "raw": "dee,4"}, {"user": "ann", "n": 1, "raw": "ann,1"}]
    # ann,1 is in the file but not in the txid's ranges: not named by a line.
    assert spout.locate(7, meta, records) == ["file p-1.csv line 2", None]


def test_parquet_rows_are_found_by_their_values(tmp_path: Path) -> None:
    at = [datetime(2026, 1, 1, h, tzinfo=UTC) for h in range(6)]
    table = pa.table(
        {
            "user": ["ann", "bob", "ann", "cy", "bob", "dee"],
            "n": [1, 2, 1, 3, 2, 4],
            "at": pa.array([at[i] for i in (0, 1, 0, 3, 1, 5)], pa.timestamp("us", tz="UTC")),
            "tags": [["a"], ["b"], ["c"], [], None, ["d"]],  # nested: not compared
        }
    )
    path = tmp_path / "part-0.parquet"
    pq.write_table(table, path, row_group_size=4)  # rows 1-4 and 5-6
    spout = FilesPartitionedSpout(tmp_path, format="parquet")
    spout.open(SpoutContext(spark=None, topology_id="t"))  # type: ignore[arg-type]
    # As Spark hands rows to Python: an instant as the local time, without a zone.
    local = [a.astimezone().replace(tzinfo=None) for a in at]
    records = [
        {"user": "ann", "n": 1, "at": local[0], "tags": ["z"]},
        {"user": "dee", "n": 4, "at": local[5], "tags": ["d"]},
        {"user": "bob", "n": 2, "at": local[1], "tags": None},
        {"user": "dee", "n": 4, "at": local[4], "tags": ["d"]},
    ]
    # The txid holds rows 2 to 6 (offset 1): row 1 is not in it.
    meta = {0: FileRange(file="part-0.parquet", offset=1, length=5, count=5)}
    assert spout.locate(3, meta, records) == [
        "file part-0.parquet row 3",
        "file part-0.parquet row 6",
        "file part-0.parquet row 2 or 5 (same values)",
        None,
    ]
    schema = pa.schema([f for f in table.schema if f.name != "tags"])
    assert find_rows(str(path), 0, 6, schema, records[:1]) == [[1, 3]]
