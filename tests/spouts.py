"""Driving a spout by hand, the way a runner drives it: the helpers the source tests
share. Metadata goes through the store's JSON on the way, as it does in a run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.reference import records_of
from transactional.spout import SpoutContext
from transactional.types import TransactionAttempt, dump_meta, load_meta

Record = tuple[str, str | None]

__all__ = [
    "CSV_LINES",
    "CSV_SCHEMA",
    "PARQUET_COLUMNS",
    "Record",
    "awkward_dataset",
    "columns",
    "csv_reference",
    "drive_partitioned",
    "drive_transactional",
    "flagged",
    "opened",
    "parquet_files",
    "parquet_rows",
    "records_of",
    "roundtrip",
    "rows",
    "sample",
]


def awkward_dataset(root: Path) -> Path:
    """300 generated tweet lines in 3 files under ``root``, plus the awkward cases
    written as raw bytes: invalid UTF-8, a CRLF line, a blank line, a last line without
    newline, and a marker file that is no partition."""
    from examples.tweets.generate import generate

    generate(root, 300, seed=11, partitions=3, bad_rate=0.1)
    with open(root / "part-00000.jsonl", "ab") as f:
        f.write(b'{"id": 1, "text": "caf\xe9 #latin1"}\n')  # invalid UTF-8
        f.write(b'{"id": 2, "text": "crlf #line"}\r\n')
        f.write(b"\n")  # a blank line is a record too
    with open(root / "part-00002.jsonl", "ab") as f:
        f.write(b'{"id": 3, "text": "no newline at EOF \xff"}')
    (root / "_SUCCESS").write_bytes(b"")  # marker files are not partitions
    return root


def rows(df: Any, columns: tuple[str, ...] = ("raw", "error")) -> list[Any]:
    """The frame's rows as tuples of ``columns`` (text records by default)."""
    return [tuple(r[c] for c in columns) for r in df.collect()]


def opened(spout: Any, spark: Any) -> Any:
    spout.open(SpoutContext(spark, "test"))
    return spout


def roundtrip(meta: Any) -> Any:
    """As the runner does: metadata goes through the store as JSON."""
    return load_meta(type(meta), dump_meta(meta))


def attempts() -> Iterator[TransactionAttempt]:
    txid = 0
    while True:
        txid += 1
        yield TransactionAttempt(txid, 1)


def drive_transactional(
    spout: Any, prev: Any, limit: int = 20, read: Callable[[Any], list[Any]] = rows
) -> tuple[list[Any], list[Any]]:
    records: list[Any] = []
    metas: list[Any] = []
    for attempt in attempts():
        assert attempt.txid < limit, "the spout never drained"
        if not spout.is_ready(attempt.txid, prev):
            return records, metas
        meta = roundtrip(spout.initialize_transaction(attempt.txid, prev))
        batch = read(spout.emit_batch(attempt, meta))
        assert len(batch) == getattr(meta, "count", len(batch))
        records += batch
        metas.append(meta)
        prev = meta
    raise AssertionError("unreachable")


def drive_partitioned(
    spout: Any,
    last: dict[int, Any],
    opaque: bool,
    limit: int = 20,
    read: Callable[[Any], list[Any]] = rows,
) -> tuple[dict[int, list[Any]], list[dict[int, Any]]]:
    """Each txid: decide every partition's range, then read all partitions as one union
    (one Spark job), sliced back by the metadata's counts."""
    records: dict[int, list[Any]] = {}
    history: list[dict[int, Any]] = []
    for attempt in attempts():
        assert attempt.txid < limit, "the spout never drained"
        if not spout.is_ready(attempt.txid, last):
            return records, history
        metas, frames = {}, []
        for p in range(spout.num_partitions()):
            if opaque:
                meta, frame = spout.emit_partition_batch(attempt, p, last.get(p))
            else:
                meta = spout.emit_partition_batch_new(attempt, p, last.get(p))
                frame = spout.emit_partition_batch(attempt, p, roundtrip(meta))
            metas[p] = roundtrip(meta)
            frames.append(frame)
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame)
        got = read(union)
        assert len(got) == sum(m.count for m in metas.values())
        for p, meta in metas.items():
            records.setdefault(p, []).extend(got[: meta.count])
            got = got[meta.count :]
        history.append(metas)
        last = {**last, **metas}
    raise AssertionError("unreachable")


def sample(spout: Any) -> tuple[list[Any], int]:
    """The sample's records, and the Spark tasks that read it."""
    frame = spout.sample_batch()
    return rows(frame), frame.rdd.getNumPartitions()


def columns(*names: str) -> Any:
    def read(df: Any) -> list[tuple[Any, ...]]:
        return rows(df, names)

    return read


def flagged(got: list[tuple[Any, ...]], what: str) -> list[tuple[Any, ...]]:
    """Errors other than invalid UTF-8 must say the record does not fit the schema;
    they are compared as "bad"."""
    out = []
    for row in got:
        error = row[-1]
        if error is not None and error != "invalid UTF-8":
            assert error.startswith(f"not {what} of the schema ("), error
            error = "bad"
        out.append((*row[:-1], error))
    return out


CSV_SCHEMA = "account STRING, amount DECIMAL(10,2), n INT"


CSV_LINES = [
    b"a,1.50,3",
    b'"b, inc",2.25,4',  # a quoted separator
    b"c,abc,1",  # not a number
    b"d,1.5",  # a field short
    b"e,1.5,2,extra",  # a field over
    b"f,,5",  # an empty field is null
    b'"g ""q""",-0.75,0',  # a doubled quote inside quotes
    b"h,1,2147483648",  # beyond INT
    b"caf\xe9,1,1",  # not UTF-8
    b"i,1.234,1",  # more places than the scale: Spark would round it
    b"j,1.230,1",  # a trailing zero fits
    b"k,-12345678.9,1",  # beyond DECIMAL(10,2)
]


def csv_reference(line: bytes) -> tuple[Any, ...]:
    """The row a CSV line of ``CSV_SCHEMA`` must give, by Python's ``csv`` and
    ``decimal``: three fields, an empty one null, the amount a decimal with at most two
    places, n a 32-bit integer; else the whole record is an error."""
    import csv
    from decimal import Decimal, InvalidOperation

    try:
        raw = line.decode("utf-8")
    except UnicodeDecodeError:
        return (None, None, None, line.decode("utf-8", "backslashreplace"), "invalid UTF-8")
    fields = next(csv.reader([raw]))
    if len(fields) != 3:
        return (None, None, None, raw, "bad")
    account, amount, n = (f if f != "" else None for f in fields)
    try:
        value = None if amount is None else Decimal(amount)
        count = None if n is None else int(n)
    except (InvalidOperation, ValueError):
        return (None, None, None, raw, "bad")
    if (
        value is not None and (value != value.quantize(Decimal("0.01")) or abs(value) >= 10**8)
    ) or (count is not None and not -(2**31) <= count < 2**31):
        return (None, None, None, raw, "bad")
    return (account, value, count, raw, None)


def parquet_files(root: Path, sizes: list[int], seed: int = 5) -> dict[str, Any]:
    """Parquet files of the given row counts, in row groups of 7 rows, with awkward
    values (nulls, non-ASCII text, microsecond timestamps, a decimal, a list)."""
    import datetime as dt
    import random
    from decimal import Decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    root.mkdir(exist_ok=True)
    tables = {}
    start = 0
    for i, size in enumerate(sizes):
        ids = list(range(start, start + size))
        start += size
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "name": pa.array([None if n % 5 == 0 else f"n{n}-é" for n in ids]),
                "at": pa.array(
                    [
                        dt.datetime(2026, 1, 1) + dt.timedelta(microseconds=rng.randint(0, 10**12))
                        for _ in ids
                    ],
                    pa.timestamp("us"),
                ),
                "amount": pa.array(
                    [Decimal(rng.randint(-(10**6), 10**6)) / 100 for _ in ids], pa.decimal128(12, 2)
                ),
                "tags": pa.array([[f"t{n % 3}"] * (n % 3) for n in ids], pa.list_(pa.string())),
            }
        )
        name = f"part-{i:05d}.parquet"
        pq.write_table(table, root / name, row_group_size=7)
        tables[name] = table
    return tables


PARQUET_COLUMNS = ("id", "name", "at", "amount", "tags")


def parquet_rows(table: Any) -> list[tuple[Any, ...]]:
    return [tuple(row[c] for c in PARQUET_COLUMNS) for row in table.to_pylist()]
