"""The Delta table source on real Delta tables (written by delta-rs and by delta-spark),
driven by hand the way a runner drives it: every appended row read once across txids,
each txid's versions replayed to the same rows; a compaction adds nothing; a version
that deletes rows, or changes the schema, stops the source with what to do instead;
the change data feed gives each change; start positions. The appends and the change
data feed are read from a local table and from one in a bucket of the S3 stand-in. The
expected rows are the rows this test wrote."""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.spouts import drive_transactional, opened
from tests.witness import clock_past
from transactional.errors import SourceDataLostError, SourceSchemaError
from transactional.sources.delta import DeltaTableSpout
from transactional.types import TransactionAttempt

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

pytestmark = [pytest.mark.integration, pytest.mark.connect]


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((r["id"], r["name"]) for r in df.collect())


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.classic)])
def table_at(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a test's tables live: a local directory, or a bucket of the S3 stand-in
    (``s3a://``, which delta-rs, pyarrow and Spark all read)."""
    if request.param == "local":
        return str(tmp_path)
    return f"s3a://{request.getfixturevalue('s3_bucket')}"


def _append(path: Path | str, ids: range, **settings: Any) -> list[tuple[Any, ...]]:
    rows = [(i, f"n{i}") for i in ids]
    table = pa.table(
        {"id": pa.array([r[0] for r in rows], pa.int64()), "name": [r[1] for r in rows]}
    )
    write_deltalake(str(path), table, mode="append", **settings)
    return rows


@pytest.mark.rotated
def test_appends_are_read_once_in_version_order_and_replay_exactly(
    spark: Any, table_at: str
) -> None:
    path = f"{table_at}/t"
    written: list[tuple[Any, ...]] = []
    for start in range(0, 50, 10):  # versions 0 to 4, 10 rows each
        written += _append(path, range(start, start + 10))
    DeltaTable(str(path)).optimize.compact()  # version 5: data moved, not changed
    spark.range(50, 55).selectExpr("id", "concat('n', id) AS name").write.format("delta").mode(
        "append"
    ).save(path)  # version 6, by delta-spark
    written += [(i, f"n{i}") for i in range(50, 55)]

    spout = opened(DeltaTableSpout(path, batch_size=25), spark)
    got, metas = drive_transactional(spout, None, read=_rows)
    assert sorted(got) == sorted(written)
    assert [(m.first, m.last, m.records) for m in metas] == [(0, 1, 20), (2, 3, 20), (4, 6, 15)]
    assert _rows(spout.emit_batch(TransactionAttempt(2, 2), metas[1])) == sorted(written[20:40])
    assert spout.lag() == 0

    more = _append(path, range(100, 103))
    assert spout.is_ready(9, metas[-1]) and spout.lag() == 1
    assert drive_transactional(spout, metas[-1], read=_rows)[0] == more


def test_a_delete_or_a_schema_change_stops_the_appends(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    _append(path, range(0, 5))
    _append(path, range(5, 10))
    DeltaTable(str(path)).delete("id = 3")  # version 2
    spout = opened(DeltaTableSpout(path, batch_size=5), spark)
    first = spout.initialize_transaction(1, None)
    assert (first.first, first.last) == (0, 0)
    second = spout.initialize_transaction(2, first)
    with pytest.raises(SourceSchemaError, match=r"version 2 of .* is a DELETE that changes"):
        spout.initialize_transaction(3, second)

    other = tmp_path / "u"
    _append(other, range(0, 5))
    wider = pa.table({"id": pa.array([9], pa.int64()), "name": ["x"], "extra": [1.5]})
    write_deltalake(str(other), wider, mode="append", schema_mode="merge")
    spout = opened(DeltaTableSpout(other, batch_size=100), spark)
    with pytest.raises(SourceSchemaError, match=r"version 1 of .* changes the table's schema"):
        spout.initialize_transaction(1, None)


def test_the_change_data_feed_gives_every_change(spark: Any, table_at: str) -> None:
    path = f"{table_at}/t"
    _append(path, range(0, 4), configuration={"delta.enableChangeDataFeed": "true"})
    table = DeltaTable(str(path))
    table.delete("id = 1")
    table.update(updates={"name": "'renamed'"}, predicate="id = 2")
    spout = opened(DeltaTableSpout(path, batch_size=1, change_data_feed=True), spark)

    def read(df: Any) -> list[tuple[Any, ...]]:
        return sorted(
            (r["_commit_version"], r["_change_type"], r["id"], r["name"]) for r in df.collect()
        )

    got, metas = drive_transactional(spout, None, read=read)
    assert [(m.first, m.last) for m in metas] == [(0, 0), (1, 1), (2, 2)]
    assert sorted(got) == sorted(
        [(0, "insert", i, f"n{i}") for i in range(4)]
        + [(1, "delete", 1, "n1")]
        + [(2, "update_preimage", 2, "n2"), (2, "update_postimage", 2, "renamed")]
    )
    plain = f"{table_at}/plain"
    _append(plain, range(2))
    from transactional.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="does not record its change data feed"):
        opened(DeltaTableSpout(plain, change_data_feed=True), spark)


def test_start_positions_and_a_lost_log(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    _append(path, range(0, 3))  # version 0
    between = clock_past(dt.datetime.now(dt.UTC))  # after version 0's commit time
    clock_past(between)  # and version 1's after it
    _append(path, range(3, 6))  # version 1

    def texts(**start: Any) -> list[tuple[Any, ...]]:
        return drive_transactional(opened(DeltaTableSpout(path, **start), spark), None, read=_rows)[
            0
        ]

    assert texts(start=1) == [(i, f"n{i}") for i in range(3, 6)]
    assert texts(start=between) == [(i, f"n{i}") for i in range(3, 6)]
    latest = opened(DeltaTableSpout(path, start="latest"), spark)
    assert latest.is_ready(1, None) is False
    later = _append(path, range(6, 8))
    assert drive_transactional(latest, None, read=_rows)[0] == later

    spout = opened(DeltaTableSpout(path, batch_size=3), spark)
    meta = spout.initialize_transaction(1, None)
    (path / "_delta_log" / f"{1:020d}.json").rename(path / "_delta_log" / "moved")
    fresh = opened(DeltaTableSpout(path, batch_size=3), spark)
    with pytest.raises(SourceDataLostError, match=r"version 1 of .* is no longer in its log"):
        fresh.initialize_transaction(2, meta)

    from transactional.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="is not a Delta table"):
        opened(DeltaTableSpout(tmp_path / "nothing"), spark)
    with pytest.raises(ConfigurationError, match="start version 9 is beyond the table's newest"):
        opened(DeltaTableSpout(path, start=9), spark)


@pytest.mark.classic
def test_the_docs_delta_example_sums_every_order_once(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from collections import Counter

    import redis

    from tests.docs import run_example

    table = tmp_path / "orders"
    orders = [("north", 12), ("south", 5), ("north", -2), ("west", 7), ("north", 30)]
    for chunk in (orders[:2], orders[2:]):
        write_deltalake(
            str(table),
            pa.table(
                {
                    "shop": [s for s, _ in chunk],
                    "amount": pa.array([a for _, a in chunk], pa.int64()),
                }
            ),
            mode="append",
        )
    run_example(
        "docs/how-to/delta-source.md",
        "",
        {"ORDERS_TABLE": str(table), "REDIS_URL": redis_url, "STATE": str(tmp_path / "state.db")},
        monkeypatch,
    )

    totals: Counter[str] = Counter()
    for shop, amount in orders:
        totals[shop] += amount
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert {k: int(v) for k, v in client.hgetall("totals").items()} == totals
    client.close()
