"""The library's file source (``transactional.sources.files``), driven by hand the way
a runner drives it: across several txids the batches must be exactly the records of
the files, in order, none lost or repeated; the same metadata must give the same
records again; a file added later is only read by metadata decided after it
appeared; each format's records are checked against an answer computed here with
Python's own ``json``, ``csv`` and ``pyarrow``; and bad files or settings get a clear
error, never a silent skip."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from examples.tweets.generate import generate
from tests.spouts import (
    CSV_LINES,
    CSV_SCHEMA,
    PARQUET_COLUMNS,
    awkward_dataset,
    columns,
    csv_reference,
    drive_partitioned,
    drive_transactional,
    flagged,
    opened,
    parquet_files,
    parquet_rows,
    records_of,
    rows,
    sample,
)
from transactional.errors import ContractError
from transactional.sources.files import (
    SAMPLE_LINES,
    FilesOpaqueSpout,
    FilesPartitionedSpout,
    FilesTransactionalSpout,
)
from transactional.types import TransactionAttempt

# Executors must run this interpreter (it has pyarrow); set before the session starts.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

pytestmark = [pytest.mark.integration, pytest.mark.connect]


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return awkward_dataset(tmp_path / "tweets")


def test_file_transactional_reads_the_directory_as_one_sequence(spark: Any, dataset: Path) -> None:
    spout = opened(FilesTransactionalSpout(dataset, batch_size=70), spark)
    files = sorted(dataset.glob("part-*.jsonl"))
    expected = [r for f in files for r in records_of(f)]

    records, metas = drive_transactional(spout, None)
    assert records == expected
    assert any(len(m.segments) > 1 for m in metas)  # some batch spans two files
    again = TransactionAttempt(len(metas), 2)
    assert rows(spout.emit_batch(again, metas[1])) == records[70:140]

    added = dataset / "part-00003.jsonl"
    added.write_bytes(b'{"id": 4, "text": "late #file"}\n{"id": 5, "text": "x"}\n')
    assert rows(spout.emit_batch(again, metas[-1])) == records[70 * (len(metas) - 1) :]
    more, new_metas = drive_transactional(spout, metas[-1])
    assert more == records_of(added)
    assert [s.file for s in new_metas[0].segments] == ["part-00003.jsonl"]


def test_file_transactional_single_file_and_empty_batches(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_bytes(b"a\nb\r\nc")
    spout = opened(FilesTransactionalSpout(path, batch_size=2), spark)
    records, metas = drive_transactional(spout, None)
    assert records == [("a", None), ("b", None), ("c", None)]
    assert spout.is_ready(9, metas[-1]) is False
    with open(path, "ab") as f:
        f.write(b"\nd\n")  # the unterminated "c" was taken: the writer broke the rule
    assert drive_transactional(spout, metas[-1])[0] == [("", None), ("d", None)]


@pytest.mark.parametrize("kind", [FilesPartitionedSpout, FilesOpaqueSpout])
def test_file_partitioned_kinds(spark: Any, dataset: Path, kind: type) -> None:
    spout = opened(kind(dataset, batch_size=40), spark)
    opaque = kind is FilesOpaqueSpout
    assert spout.num_partitions() == 3

    records, history = drive_partitioned(spout, {}, opaque)
    files = sorted(dataset.glob("part-*.jsonl"))
    assert records == {p: records_of(f) for p, f in enumerate(files)}
    assert all(m.file == files[p].name for metas in history for p, m in metas.items())

    if not opaque:  # the same metadata gives the same records
        meta = history[1][2]
        again = rows(spout.emit_partition_batch(TransactionAttempt(2, 7), 2, meta))
        assert again == records[2][40:80]

    added = dataset / "part-00003.jsonl"
    added.write_bytes(b'{"id": 4, "text": "late #partition"}\n')
    assert spout.num_partitions() == 4
    last = {p: m for metas in history for p, m in metas.items()}
    if not opaque:  # old metadata knows nothing of partition 3
        old = history[0]
        frames = [
            spout.emit_partition_batch(TransactionAttempt(1, 9), p, m) for p, m in old.items()
        ]
        assert sum(len(rows(f)) for f in frames) == sum(m.count for m in old.values())
    more, _ = drive_partitioned(spout, last, opaque)
    assert more == {0: [], 1: [], 2: [], 3: records_of(added)}


def test_file_spouts_refuse_a_partition_file_inserted_before_others(
    spark: Any, dataset: Path
) -> None:
    spout = opened(FilesPartitionedSpout(dataset, batch_size=1000), spark)
    attempt = TransactionAttempt(1, 1)
    last = {p: spout.emit_partition_batch_new(attempt, p, None) for p in range(3)}
    (dataset / "part-00000a.jsonl").write_bytes(b"x\n")
    with pytest.raises(Exception, match="sort after the existing ones"):
        spout.emit_partition_batch_new(TransactionAttempt(2, 1), 1, last[1])


@pytest.mark.classic
@pytest.mark.parametrize("kind", [FilesTransactionalSpout, FilesPartitionedSpout, FilesOpaqueSpout])
def test_file_spouts_sample_the_first_lines_in_parallel_tasks(
    spark: Any, tmp_path: Path, kind: type
) -> None:
    root = tmp_path / "in"
    root.mkdir()
    (root / "part-00000.jsonl").write_bytes(b"")  # an empty first file is passed over
    generate(root / "more", SAMPLE_LINES + 40, seed=3, partitions=1, bad_rate=0.1)
    (root / "more" / "part-00000.jsonl").rename(root / "part-00001.jsonl")
    (root / "more").rmdir()
    spout = opened(kind(root, batch_size=7), spark)
    records, tasks = sample(spout)
    assert records == records_of(root / "part-00001.jsonl")[:SAMPLE_LINES]
    assert tasks == spark.sparkContext.defaultParallelism
    for name in os.listdir(root):
        (root / name).write_bytes(b"")
    assert spout.sample_batch() is None  # nothing to sample: no warm-up


@pytest.mark.classic
def test_file_partitioned_emits_all_partitions_as_one_tagged_frame(
    spark: Any, dataset: Path
) -> None:
    """The one frame holds each partition's records of the same metadata, tagged with
    the partition, in fewer tasks; the engine reads the same batch and the same digests
    from it as from the per-partition frames."""
    from transactional.spark.engine import SparkEngine
    from transactional.spout import PARTITION_COLUMN

    spout = opened(FilesPartitionedSpout(dataset, batch_size=40), spark)
    attempt = TransactionAttempt(1, 1)
    metas = {p: spout.emit_partition_batch_new(attempt, p, None) for p in range(3)}
    metas[1] = spout.emit_partition_batch_new(attempt, 1, metas[1])  # not at offset 0
    combined = spout.emit_partitions(attempt, metas)
    collected = combined.collect()
    files = sorted(dataset.glob("part-*.jsonl"))
    for p, meta in metas.items():
        mine = [(r.raw, r.error) for r in collected if r[PARTITION_COLUMN] == p]
        assert mine == rows(spout.emit_partition_batch(attempt, p, meta))
        assert mine == records_of(files[p])[meta.offset and 40 : (meta.offset and 40) + 40]
    assert combined.rdd.getNumPartitions() <= spark.sparkContext.defaultParallelism

    engine = SparkEngine(spark)
    one = engine.materialise([combined], True, partitions=3)
    per = engine.materialise(
        [spout.emit_partition_batch(attempt, p, metas[p]) for p in range(3)], True
    )
    assert one.digests == per.digests and one.records == per.records == 120
    assert sorted(rows(one.batch)) == sorted(rows(per.batch))
    assert engine.materialise([combined], False, partitions=3).records == 120
    stray = combined.withColumn(PARTITION_COLUMN, combined[PARTITION_COLUMN] + 3)
    with pytest.raises(ContractError, match="tagged with partition 3"):
        engine.materialise([stray], True, partitions=3)


# ---------------------------------------------------------------- formats

JSON_SCHEMA = "id INT, name STRING, score DOUBLE"
JSON_LINES = [
    b'{"id": 1, "name": "a", "score": 2.5}',
    b'{"id": 2, "name": "b"}',  # a missing field is null, not an error
    b'{"id": 1.5, "name": "c"}',  # a fraction into INT
    b'{"id": 3000000000, "name": "d"}',  # beyond INT
    b"not json",
    b"",
    b"[1, 2]",
    b'{"id": 4, "name": "caf\xe9"}',  # not UTF-8
    b'{"id": -7, "name": "z\\u00e9", "score": 1e3}',
    b'{"id": "8", "name": "e"}',  # a string into INT
]


def _json_reference(line: bytes) -> tuple[Any, ...]:
    """The row a JSON line of ``JSON_SCHEMA`` must give, by Python's ``json``: a field
    is absent or of its type (an INT a JSON integer within 32 bits, a DOUBLE any JSON
    number, a STRING a JSON string), else the whole record is an error."""
    import json

    try:
        raw = line.decode("utf-8")
    except UnicodeDecodeError:
        return (None, None, None, line.decode("utf-8", "backslashreplace"), "invalid UTF-8")
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    checks = {
        "id": lambda v: type(v) is int and -(2**31) <= v < 2**31,
        "name": lambda v: isinstance(v, str),
        "score": lambda v: type(v) in (int, float),
    }
    if not isinstance(value, dict) or not all(
        check(value[k]) for k, check in checks.items() if k in value
    ):
        return (None, None, None, raw, "bad")
    score = value.get("score")
    return (value.get("id"), value.get("name"), None if score is None else float(score), raw, None)


@pytest.mark.parametrize("kind", [FilesTransactionalSpout, FilesPartitionedSpout])
def test_json_lines_with_a_schema_give_its_columns_and_flag_what_does_not_fit(
    spark: Any, tmp_path: Path, kind: type
) -> None:
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.jsonl").write_bytes(b"\n".join(JSON_LINES[:6]) + b"\n")
    (root / "b.jsonl").write_bytes(b"\r\n".join(JSON_LINES[6:]))
    spout = opened(kind(root, batch_size=4, schema=JSON_SCHEMA), spark)
    read = columns("id", "name", "score", "raw", "error")
    if kind is FilesTransactionalSpout:
        got, _ = drive_transactional(spout, None, read=read)
    else:
        by_partition, _ = drive_partitioned(spout, {}, False, read=read)
        got = by_partition[0] + by_partition[1]
    assert flagged(got, "a JSON object") == [_json_reference(line) for line in JSON_LINES]


def test_a_decimal_with_more_places_than_its_scale_is_flagged_not_rounded(
    spark: Any, tmp_path: Path
) -> None:
    """Spark's JSON reader rounds 1.234 into DECIMAL(6,2) as 1.23 without a word: the
    source flags it instead. Reference: Python's ``json`` with ``Decimal`` numbers."""
    import json
    from decimal import Decimal

    lines = [
        b'{"id": 1, "price": 1.5}',
        b'{"id": 2, "price": 1.234}',
        b'{"id": 3, "price": 12345.678}',
        b'{"id": 4, "price": 1e2}',
        b'{"id": 5, "price": 99.990}',
        b'{"id": 6}',
    ]
    path = tmp_path / "prices.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    spout = opened(
        FilesTransactionalSpout(path, batch_size=10, schema="id INT, price DECIMAL(6,2)"), spark
    )
    got, _ = drive_transactional(spout, None, read=columns("id", "price", "error"))

    def reference(line: bytes) -> tuple[Any, ...]:
        value = json.loads(line, parse_float=Decimal).get("price")
        if value is None:
            return (json.loads(line)["id"], None, None)
        value = Decimal(value)
        if value != value.quantize(Decimal("0.01")) or abs(value) >= 10**4:
            return (None, None, "bad")
        return (json.loads(line)["id"], value.quantize(Decimal("0.01")), None)

    assert flagged(got, "a JSON object") == [reference(line) for line in lines]


@pytest.mark.parametrize("kind", [FilesTransactionalSpout, FilesPartitionedSpout, FilesOpaqueSpout])
def test_csv_with_a_header_gives_the_schemas_columns_and_flags_what_does_not_fit(
    spark: Any, tmp_path: Path, kind: type
) -> None:
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.csv").write_bytes(b"account,amount,n\n" + b"\n".join(CSV_LINES[:5]) + b"\n")
    (root / "b.csv").write_bytes(b"account,amount,n\r\n" + b"\r\n".join(CSV_LINES[5:]) + b"\r\n")
    spout = opened(kind(root, batch_size=3, format="csv", schema=CSV_SCHEMA, header=True), spark)
    read = columns("account", "amount", "n", "raw", "error")
    if kind is FilesTransactionalSpout:
        got, metas = drive_transactional(spout, None, read=read)
        assert metas[0].segments[0].offset == len(b"account,amount,n\n")  # the header
    else:
        by_partition, _ = drive_partitioned(spout, {}, kind is FilesOpaqueSpout, read=read)
        got = by_partition[0] + by_partition[1]
    assert flagged(got, "a CSV record") == [csv_reference(line) for line in CSV_LINES]

    (root / "c.csv").write_bytes(b"account,n,amount\nz,1,2\n")  # another layout
    from transactional.errors import SourceSchemaError

    with pytest.raises(SourceSchemaError, match=r"header of .*c\.csv names the columns"):
        if kind is FilesTransactionalSpout:
            spout.is_ready(99, None)
            spout.initialize_transaction(99, None)
        else:
            spout.is_ready(99, {})


@pytest.mark.parametrize("kind", [FilesTransactionalSpout, FilesPartitionedSpout, FilesOpaqueSpout])
def test_parquet_row_ranges_read_every_row_once_across_row_groups(
    spark: Any, tmp_path: Path, kind: type
) -> None:
    root = tmp_path / "in"
    tables = parquet_files(root, [23, 0, 16])
    spout = opened(kind(root, batch_size=9, format="parquet"), spark)

    def read(df: Any) -> list[tuple[Any, ...]]:
        out = []
        for r in df.collect():
            row = r.asDict()
            row["tags"] = list(row["tags"])
            out.append(tuple(row[c] for c in PARQUET_COLUMNS))
        return out

    expected = {name: parquet_rows(t) for name, t in tables.items()}
    if kind is FilesTransactionalSpout:
        got, metas = drive_transactional(spout, None, read=read)
        assert got == [r for name in sorted(expected) for r in expected[name]]
        assert _rows_again(spout.emit_batch(TransactionAttempt(2, 2), metas[1]), read) == got[9:18]
        last: Any = metas[-1]
    else:
        by_partition, history = drive_partitioned(spout, {}, kind is FilesOpaqueSpout, read=read)
        assert by_partition == {p: expected[n] for p, n in enumerate(sorted(expected))}
        if kind is FilesPartitionedSpout:  # one frame of all partitions, tagged
            from transactional.spout import PARTITION_COLUMN

            frame = spout.emit_partitions(TransactionAttempt(2, 2), history[1])
            tagged = [(r[PARTITION_COLUMN], r["id"]) for r in frame.collect()]
            assert sorted(tagged) == sorted(
                (p, row[0])
                for p, m in history[1].items()
                for row in expected[m.file][m.offset : m.end]
            )
        last = {p: m for metas in history for p, m in metas.items()}

    more = parquet_files(tmp_path / "later", [5], seed=9)["part-00000.parquet"]
    import pyarrow.parquet as pq

    pq.write_table(more, root / "part-00003.parquet")
    if kind is FilesTransactionalSpout:
        assert drive_transactional(spout, last, read=read)[0] == parquet_rows(more)
    else:
        added, _ = drive_partitioned(spout, last, kind is FilesOpaqueSpout, read=read)
        assert added == {0: [], 1: [], 2: [], 3: parquet_rows(more)}


def _rows_again(frame: Any, read: Any) -> list[tuple[Any, ...]]:
    return list(read(frame))


def test_a_parquet_file_with_other_columns_stops_the_source(spark: Any, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from transactional.errors import SourceSchemaError

    root = tmp_path / "in"
    root.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "v": ["a", "b"]}), root / "a.parquet")
    pq.write_table(pa.table({"id": [3], "v": ["c"], "w": [1.5]}), root / "b.parquet")
    pq.write_table(pa.table({"id": [4]}), root / "c.parquet")
    spout = opened(FilesPartitionedSpout(root, format="parquet"), spark)
    attempt = TransactionAttempt(1, 1)
    assert spout.emit_partition_batch_new(attempt, 0, None).count == 2
    with pytest.raises(SourceSchemaError, match=r"b\.parquet has the columns id, v, w.*not in "):
        spout.emit_partition_batch_new(attempt, 1, None)
    chosen = opened(
        FilesPartitionedSpout(root, format="parquet", schema="id LONG, v STRING"), spark
    )
    assert chosen.emit_partition_batch_new(attempt, 1, None).count == 1  # w left out, by choice
    with pytest.raises(SourceSchemaError, match=r"c\.parquet has the columns id.*missing: v"):
        chosen.emit_partition_batch_new(attempt, 2, None)

    (root / "d.parquet").write_bytes(b"PAR1 not really")
    from transactional.errors import EmitError

    with pytest.raises(EmitError, match=r"d\.parquet is not a readable Parquet file"):
        chosen.is_ready(2, {})


# ---------------------------------------------------------------- start positions


def _lines_dir(root: Path, files: dict[str, list[str]]) -> Path:
    root.mkdir(exist_ok=True)
    for name, content in files.items():
        (root / name).write_text("".join(f"{line}\n" for line in content))
    return root


@pytest.mark.parametrize("kind", [FilesPartitionedSpout, FilesOpaqueSpout])
def test_partitioned_start_positions(spark: Any, tmp_path: Path, kind: type) -> None:
    import datetime as dt

    opaque = kind is FilesOpaqueSpout
    root = _lines_dir(tmp_path / "in", {"a": ["a1", "a2", "a3"], "b": ["b1", "b2"]})

    def texts(spout: Any, last: dict[int, Any]) -> tuple[dict[int, list[str]], dict[int, Any]]:
        got, history = drive_partitioned(spout, last, opaque)
        for metas in history:
            last = {**last, **metas}
        return {p: [raw for raw, _ in records] for p, records in got.items()}, last

    latest = opened(kind(root, batch_size=2, start="latest"), spark)
    assert latest.is_ready(1, {}) is False  # nothing after the start
    with open(root / "a", "a") as f:
        f.write("a4\n")
    (root / "c").write_text("c1\n")  # a file added after the start: read whole
    got, last = texts(latest, {})
    assert got == {0: ["a4"], 1: [], 2: ["c1"]}

    offsets = opened(kind(root, batch_size=2, start={"a": len("a1\na2\n")}), spark)
    assert texts(offsets, {})[0] == {0: ["a3", "a4"], 1: ["b1", "b2"], 2: ["c1"]}

    old = dt.datetime(2020, 1, 1).timestamp()
    os.utime(root / "a", (old, old))
    since = opened(kind(root, batch_size=5, start=dt.datetime(2021, 1, 1)), spark)
    assert texts(since, {})[0] == {0: [], 1: ["b1", "b2"], 2: ["c1"]}

    # A topology that already read something: a new file starts at its beginning even
    # under "latest" (it is not a file of the start).
    restarted = opened(kind(root, batch_size=5, start="latest"), spark)
    (root / "d").write_text("d1\n")
    assert texts(restarted, last)[0] == {0: [], 1: [], 2: [], 3: ["d1"]}


def test_transactional_start_positions(spark: Any, tmp_path: Path) -> None:
    root = _lines_dir(tmp_path / "in", {"a": ["a1", "a2"], "b": ["b1", "b2"]})

    def texts(spout: Any) -> list[str]:
        return [raw for raw, _ in drive_transactional(spout, None)[0]]

    latest = opened(FilesTransactionalSpout(root, batch_size=3, start="latest"), spark)
    assert latest.is_ready(1, None) is False
    with open(root / "b", "a") as f:
        f.write("b3\n")
    (root / "c").write_text("c1\n")
    assert texts(latest) == ["b3", "c1"]

    at = opened(FilesTransactionalSpout(root, batch_size=3, start={"a": 3}), spark)
    assert texts(at) == ["a2", "b1", "b2", "b3", "c1"]


def test_bad_settings_are_refused_with_what_to_change(spark: Any, tmp_path: Path) -> None:
    from transactional.errors import ConfigurationError

    root = _lines_dir(tmp_path / "in", {"a": ["a1", "a2"], "b": ["b1"]})
    refused = {
        "format must be 'jsonl', 'csv' or 'parquet', not 'xml'": dict(format="xml"),
        "a CSV source needs schema=": dict(format="csv"),
        "header=True is for format='csv'": dict(header=True),
        "start must be 'earliest', 'latest'": dict(start="newest"),
        "batch_size must be at least 1": dict(batch_size=0),
    }
    for message, settings in refused.items():
        with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
            FilesPartitionedSpout(root, **settings)
    at_open = {
        "start offset 1 of 'a' is not the start of a line": dict(start={"a": 1}),
        "start names 'z', which is not a file of": dict(start={"z": 0}),
        "start offset 99 of 'a' is outside the file": dict(start={"a": 99}),
        "schema 'id INTEGR' is not a DDL schema": dict(schema="id INTEGR"),
        "the schema's column 'raw' would hide": dict(schema="raw STRING"),
        "does not exist: give the path": dict(),
    }
    for message, settings in at_open.items():
        path = tmp_path / "nope" if not settings else root
        with pytest.raises(ConfigurationError, match=message):
            opened(FilesPartitionedSpout(path, **settings), spark)
    with pytest.raises(ConfigurationError, match="names one file and offset"):
        opened(FilesTransactionalSpout(root, start={"a": 0, "b": 0}), spark)


@pytest.mark.classic
def test_the_docs_files_example_sums_every_order_once(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import redis

    from tests.docs import run_example
    from tests.reference import expected_orders, write_orders

    orders = write_orders(tmp_path / "orders")
    run_example(
        "docs/how-to/files.md",
        "",
        {"ORDERS": str(orders), "REDIS_URL": redis_url, "STATE": str(tmp_path / "state.db")},
        monkeypatch,
    )

    good, bad = expected_orders()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert {k: int(v) for k, v in client.hgetall("totals").items()} == good
    letters = [json.loads(v) for v in client.lrange("dead_letters", 0, -1)]
    assert sorted(b["raw"] for b in letters) == sorted(bad)
    client.close()
