"""Spark's own text reader, used for whole finished files, against the framing rule:
the same records as the range reader gives for the same bytes, whichever reader a
replay takes, and never a line more or less when a file changes under it."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.reference import records_of
from transactional.sources.base import split_frame
from transactional.sources.files import FilesTransactionalSpout
from transactional.sources.files import _lines as lines
from transactional.spout import SpoutContext
from transactional.types import TransactionAttempt

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

pytestmark = [pytest.mark.integration, pytest.mark.connect]

#: Fragments that make lines awkward: multi-byte characters, every kind of malformed
#: UTF-8 (stray continuation, overlong, surrogate, beyond U+10FFFF, truncated), U+FFFD
#: itself, carriage returns, a backslash, NUL.
FRAGMENTS = [
    b"a",
    b'{"id": 1, "text": "#x @y"}',
    b"\xc3\xa9",
    b"\xe2\x82\xac",
    b"\xf0\x9f\x98\x80",
    b"\xef\xbf\xbd",
    b"\x80",
    b"\xbf",
    b"\xc0\xaf",
    b"\xe0\x80\xaf",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xf8\x88\x80\x80\x80",
    b"\xff",
    b"\xe2\x82",
    b"\xf0\x9f",
    b"\xc3",
    b"\r",
    b"\\",
    b"\x00",
]


def _corpus(seed: int) -> bytes:
    rng = random.Random(seed)
    body = [b"".join(rng.choices(FRAGMENTS, k=rng.randint(0, 10))) for _ in range(4000)]
    body += [bytes([b]) for b in range(256) if b != ord("\n")]  # every single byte
    body += [b"", b"\r", b"\r\r", b"x\ry", b"\xff\r"]
    return b"\n".join(body) + b"\nlast line without newline\r"


def _rows(df: Any) -> list[tuple[str, str | None]]:
    return [(r.raw, r.error) for r in df.collect()]


def test_spark_reader_gives_the_records_of_the_framing_rule(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "awkward.jsonl"
    path.write_bytes(_corpus(seed=3))
    expected = records_of(path)
    assert sum(1 for _, error in expected if error) > 1000  # the corpus is awkward

    assert _rows(lines.read_text_files(spark, [str(path)])) == expected
    by_range = split_frame(
        spark,
        lines.file_splits(str(path), 0, path.stat().st_size, 1 << 14),
        "path STRING, start LONG, end LONG, lo LONG, hi LONG",
        lines.read_file_splits,
    )
    assert _rows(by_range) == expected


@pytest.mark.parametrize(
    ("path", "readable"),
    [
        ("/data/in/part-00001.jsonl", True),
        ("/data/in/part[1].jsonl", False),  # a glob to Spark
        ("/data/in/a b.jsonl", False),
        ("/data/in/x:y.jsonl", False),  # a URI scheme to Hadoop
        ("/data/_tmp/part-1.jsonl", False),  # hidden by Spark's file index
        ("/data/.cache/part-1.jsonl", False),
        ("relative/part-1.jsonl", False),
    ],
)
def test_only_plain_absolute_paths_go_to_spark(path: str, readable: bool) -> None:
    assert lines.readable_by_spark(path) is readable


def _spout(spark: Any, root: Path, batch_size: int) -> FilesTransactionalSpout:
    spout = FilesTransactionalSpout(root, batch_size=batch_size)
    spout.open(SpoutContext(spark, "test"))
    return spout


def _by_spark(df: Any) -> set[str]:
    """The files a frame reads with Spark's reader (the range reader lists none)."""
    return {Path(uri.removeprefix("file://")).name for uri in df.inputFiles()}


def _write(root: Path, seed: int, files: int, lines_per_file: int = 500) -> list[Path]:
    """Files of ``lines_per_file`` awkward lines each; the last one's last line has no
    newline."""
    root.mkdir()
    paths = []
    for i in range(files):
        path = root / f"part-{i:05d}.jsonl"
        data = b"\n".join(_corpus(seed + i).split(b"\n")[:lines_per_file])
        path.write_bytes(data if i == files - 1 else data + b"\n")
        paths.append(path)
    return paths


def test_whole_finished_files_are_read_by_spark_the_rest_by_range(
    spark: Any, tmp_path: Path
) -> None:
    paths = _write(tmp_path / "in", seed=5, files=4)
    per_file = [records_of(p) for p in paths]
    assert {len(r) for r in per_file} == {500}
    # One txid per file: each segment is a whole file.
    spout = _spout(spark, tmp_path / "in", batch_size=500)
    prev = None
    for i, path in enumerate(paths):
        meta = spout.initialize_transaction(i + 1, prev)
        assert [(s.file, s.offset, s.count) for s in meta.segments] == [(path.name, 0, 500)]
        frame = spout.emit_batch(TransactionAttempt(i + 1, 0), meta)
        # The last file may still grow: only files followed by another go to Spark.
        assert _by_spark(frame) == ({path.name} if i < len(paths) - 1 else set())
        assert _rows(frame) == per_file[i]
        prev = meta

    # A txid of several segments keeps their order across the two readers.
    spout = _spout(spark, tmp_path / "in", batch_size=1010)
    meta = spout.initialize_transaction(1, None)
    frame = spout.emit_batch(TransactionAttempt(1, 0), meta)
    assert _by_spark(frame) == {paths[0].name, paths[1].name}
    assert _rows(frame) == per_file[0] + per_file[1] + per_file[2][:10]


def test_a_replay_after_a_finished_file_grew_reads_the_stored_range(
    spark: Any, tmp_path: Path
) -> None:
    paths = _write(tmp_path / "in", seed=9, files=2)
    first = records_of(paths[0])
    spout = _spout(spark, tmp_path / "in", batch_size=len(first))
    meta = spout.initialize_transaction(1, None)
    assert _by_spark(spout.emit_batch(TransactionAttempt(1, 0), meta)) == {paths[0].name}

    with open(paths[0], "ab") as f:  # the writer broke the rule: the file was finished
        f.write(b'{"id": 7, "text": "late"}\n')
    replay = spout.emit_batch(TransactionAttempt(1, 1), meta)
    assert _by_spark(replay) == set()
    assert _rows(replay) == first


def test_a_file_that_grows_while_spark_lists_it_is_read_by_range(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _write(tmp_path / "in", seed=13, files=2)
    first = records_of(paths[0])
    spout = _spout(spark, tmp_path / "in", batch_size=len(first))
    meta = spout.initialize_transaction(1, None)
    read_text_files = lines.read_text_files

    def growing(session: Any, files: list[str]) -> Any:
        frame = read_text_files(session, files)  # Spark has listed the file ...
        with open(files[0], "ab") as f:  # ... and then it grows
            f.write(b'{"id": 8, "text": "late"}\n')
        return frame

    monkeypatch.setattr(lines, "read_text_files", growing)
    frame = spout.emit_batch(TransactionAttempt(1, 0), meta)
    assert _by_spark(frame) == set()
    assert _rows(frame) == first
