"""A 10 MiB line through the demo's file reader: counted by the driver's scan, read
whole by exactly one of the Spark tasks whose byte splits it spans, decoded into Arrow."""

from __future__ import annotations

from pathlib import Path

from examples.tweets.lines import INVALID_UTF8, file_splits, read_file_split, scan_lines

BIG = 10 << 20


def test_a_10_mib_line_is_one_record_whatever_the_splits(tmp_path: Path) -> None:
    lines = [
        b'{"id": 0, "text": "a"}',
        b'{"id": 1, "text": "#big ' + b"x" * BIG + b'"}',
        b"short\r",  # CRLF
        b"\xff" + b"y" * BIG,  # 10 MiB that is not UTF-8
        b'{"id": 2, "text": "z"}',
    ]
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    size = path.stat().st_size

    assert scan_lines(str(path), 0, 100) == (size, 5)
    two = len(lines[0]) + len(lines[1]) + 2
    assert scan_lines(str(path), 0, 2) == (two, 2)  # stops right after the big line
    assert scan_lines(str(path), two, 1) == (len(lines[2]) + 1, 1)

    expected = [
        (line.removesuffix(b"\r").decode("utf-8", "backslashreplace"), error)
        for line, error in zip(lines, [None, None, None, INVALID_UTF8, None], strict=True)
    ]
    for split_bytes in (3 << 20, BIG + 1, 64 << 20):  # splits inside, across, around the lines
        splits = file_splits(str(path), 0, size, split_bytes)
        rows: list[tuple[str, str | None]] = []
        for split in splits:
            batch = read_file_split(*split)
            rows += zip(
                batch.column("raw").to_pylist(), batch.column("error").to_pylist(), strict=True
            )
        assert rows == expected, split_bytes
