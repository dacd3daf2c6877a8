"""Lines into records: the framing rule against a plain-Python reference, and a 10 MiB line through the file source's reader: counted by the driver's scan, read
whole by exactly one of the Spark tasks whose byte splits it spans, decoded into Arrow."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from transactional.sources.files._lines import (
    INVALID_UTF8,
    file_splits,
    read_file_split,
    records_batch,
    records_from_bytes,
    scan_lines,
)

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


def reference(data: bytes) -> list[tuple[str, str | None]]:
    """The framing rule of ``transactional.sources.files._lines``, line by line in plain Python."""
    if not data:
        return []
    out = []
    for line in data.removesuffix(b"\n").split(b"\n"):
        line = line.removesuffix(b"\r")
        try:
            out.append((line.decode("utf-8"), None))
        except UnicodeDecodeError:
            out.append((line.decode("utf-8", "backslashreplace"), INVALID_UTF8))
    return out


PIECES = [
    b"a",
    b'{"t": "#x"}',
    b"\n",
    b"\r",
    b"\r\n",
    b"\xff",
    b"\xc3",
    b"\xc3\xa9",
    b"\xf0\x9f\x99\x82",
    b"",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=60), st.integers(1, 5))
def test_arrow_decoding_follows_the_framing_rule(pieces: list[bytes], repeat: int) -> None:
    data = b"".join(pieces) * repeat
    batch = records_from_bytes(data)
    got = list(zip(batch.column("raw").to_pylist(), batch.column("error").to_pylist(), strict=True))
    assert got == reference(data)
    lines = data.split(b"\n")
    batch = records_batch(lines)
    got = list(zip(batch.column("raw").to_pylist(), batch.column("error").to_pylist(), strict=True))
    assert got == [reference(line + b"\n")[0] for line in lines]  # one record per message


def test_a_bad_line_costs_only_its_block_and_keeps_every_line_in_order() -> None:
    lines = [f'{{"id": {i}}}'.encode() for i in range(5000)]
    lines[1500] = b"\xff\xfe"
    lines[4999] = b"tail\r"
    batch = records_from_bytes(b"\n".join(lines) + b"\n")
    assert batch.num_rows == 5000 and batch.schema == records_from_bytes(b"x").schema
    assert batch.column("raw").to_pylist() == [r for r, _ in reference(b"\n".join(lines))]
    errors = batch.column("error").to_pylist()
    assert [i for i, e in enumerate(errors) if e] == [1500] and errors[1500] == INVALID_UTF8
