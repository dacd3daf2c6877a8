"""The file source reading from a bucket of the S3 stand-in (moto's server), reached only
through the standard AWS settings: listing, sizes and ranges decided on the driver by
pyarrow's S3 file system, the ranges read in Spark tasks. Each format's records must be
those of the same files read locally by Python's own ``json``, ``csv`` and ``pyarrow``
(the answers of ``test_file_source``), none lost or repeated; a file uploaded later is
read by the next txids; a missing prefix is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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
)
from transactional.errors import ConfigurationError
from transactional.sources.files import (
    FilesOpaqueSpout,
    FilesPartitionedSpout,
    FilesTransactionalSpout,
)

pytestmark = pytest.mark.integration


def _upload(files: list[Path], bucket: str, prefix: str) -> None:
    """Each file to ``s3://bucket/prefix/<name>``, by pyarrow (not the code under test)."""
    import pyarrow.fs as pa_fs

    s3 = pa_fs.FileSystem.from_uri(f"s3://{bucket}")[0]
    for path in files:
        with s3.open_output_stream(f"{bucket}/{prefix}/{path.name}") as out:
            out.write(path.read_bytes())


@pytest.mark.parametrize("kind", [FilesTransactionalSpout, FilesPartitionedSpout, FilesOpaqueSpout])
def test_json_lines_in_a_bucket_are_read_exactly_and_a_later_file_is_read_next(
    spark: Any, s3_bucket: str, tmp_path: Path, kind: type
) -> None:
    local = awkward_dataset(tmp_path / "tweets")
    files = sorted(local.glob("part-*.jsonl"))
    _upload([*files, *local.glob("_*")], s3_bucket, "in")  # a marker file is no partition
    spout = opened(kind(f"s3a://{s3_bucket}/in", batch_size=70), spark)
    if kind is FilesTransactionalSpout:
        got, metas = drive_transactional(spout, None)
        assert got == [r for f in files for r in records_of(f)]
        last: Any = metas[-1]
    else:
        by_partition, history = drive_partitioned(spout, {}, kind is FilesOpaqueSpout)
        assert by_partition == {p: records_of(f) for p, f in enumerate(files)}
        last = {p: m for metas in history for p, m in metas.items()}

    added = tmp_path / "part-00003.jsonl"
    added.write_bytes('{"id": 4, "text": "late #s3 é"}\n{"id": 5}\r\nlast'.encode())
    _upload([added], s3_bucket, "in")
    if kind is FilesTransactionalSpout:
        assert drive_transactional(spout, last)[0] == records_of(added)
    else:
        more, _ = drive_partitioned(spout, last, kind is FilesOpaqueSpout)
        assert more == {0: [], 1: [], 2: [], 3: records_of(added)}


def test_csv_with_headers_in_a_bucket_gives_the_schemascolumns(
    spark: Any, s3_bucket: str, tmp_path: Path
) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_bytes(b"account,amount,n\n" + b"\n".join(CSV_LINES[:5]) + b"\n")
    b.write_bytes(b"account,amount,n\r\n" + b"\r\n".join(CSV_LINES[5:]) + b"\r\n")
    _upload([a, b], s3_bucket, "csv")
    spout = FilesTransactionalSpout(
        f"s3://{s3_bucket}/csv", batch_size=3, format="csv", schema=CSV_SCHEMA, header=True
    )
    got, _ = drive_transactional(
        opened(spout, spark), None, read=columns("account", "amount", "n", "raw", "error")
    )
    assert flagged(got, "a CSV record") == [csv_reference(line) for line in CSV_LINES]


def test_parquet_row_ranges_in_a_bucket_are_read_once_each(
    spark: Any, s3_bucket: str, tmp_path: Path
) -> None:
    tables = parquet_files(tmp_path / "in", [23, 0, 16])
    _upload(sorted((tmp_path / "in").iterdir()), s3_bucket, "pq")
    spout = opened(
        FilesPartitionedSpout(f"s3://{s3_bucket}/pq", batch_size=9, format="parquet"), spark
    )

    def read(df: Any) -> list[tuple[Any, ...]]:
        return [
            tuple(list(r["tags"]) if c == "tags" else r[c] for c in PARQUET_COLUMNS)
            for r in df.collect()
        ]

    by_partition, _ = drive_partitioned(spout, {}, False, read=read)
    assert by_partition == {p: parquet_rows(tables[name]) for p, name in enumerate(sorted(tables))}


def test_a_missing_prefix_or_a_store_not_read_is_refused(spark: Any, s3_bucket: str) -> None:
    with pytest.raises(ConfigurationError, match=r"s3://.*/nothing does not exist"):
        opened(FilesTransactionalSpout(f"s3://{s3_bucket}/nothing"), spark)
    with pytest.raises(ConfigurationError, match=r"gs://lake/in is not a place"):
        FilesPartitionedSpout("gs://lake/in")


def test_the_docs_s3_example_sums_every_order_once(
    spark: Any, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The S3 page's topology, run as printed with its locations in the test's bucket:
    the orders uploaded as CSV files, the totals and dead letters read back from the
    Delta tables with ``deltalake``."""
    from deltalake import DeltaTable

    from tests.docs import run_example
    from tests.reference import expected_orders, write_orders

    _upload(sorted(write_orders(tmp_path / "orders").iterdir()), s3_bucket, "orders")
    tables = f"s3://{s3_bucket}/tables"
    settings = {
        "ORDERS": f"s3://{s3_bucket}/orders",
        "TABLES": tables,
        "STATE": str(tmp_path / "state.db"),
    }
    run_example("docs/how-to/object-storage.md", "", settings, monkeypatch)

    good, bad = expected_orders()
    totals = DeltaTable(f"{tables}/totals").to_pyarrow_table().to_pylist()
    assert {r["shop"]: r["count"] for r in totals} == good
    letters = DeltaTable(f"{tables}/dead_letters").to_pyarrow_table().to_pylist()
    assert sorted(r["raw"] for r in letters) == sorted(bad)
