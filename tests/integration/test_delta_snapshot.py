"""Reads never mix (real Delta): ``DeltaCommitter.snapshot`` gives every table of a
committer as of one committed txid, while a writer commits, after a commit cut short
between tables, and in opaque mode (where only a txid some table has passed is final)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from committers import CounterTable, DeltaCommitter
from committers.delta._committer import DeltaBatch
from tests.integration.delta_faults import broken
from transactional.committer import CommitterContext
from transactional.errors import CommitError, ConfigurationError
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

pytestmark = pytest.mark.integration

NAMES = ("t0", "t1", "t2")
TABLES = {f"in_{n}": CounterTable(n, ("k",), "n") for n in NAMES}
ALL = [*NAMES, "dead_letters"]


def increments(txid: int, variant: int = 0) -> dict[str, list[tuple[str, int]]]:
    """Known increments of each table for ``txid`` (``variant``: another attempt)."""
    return {
        name: [(f"k{(txid + variant) % 3}", txid * (i + 1)), (f"k{(txid + i) % 4}", 1 + variant)]
        for i, name in enumerate(NAMES)
    }


def inputs(spark: Any, txid: int, variant: int = 0) -> dict[str, Any]:
    given = {
        f"in_{name}": spark.createDataFrame(rows, "k string, n bigint")
        for name, rows in increments(txid, variant).items()
    }
    given["bad"] = spark.createDataFrame(
        [(f"raw{txid}.{variant}", "r")], "raw string, reason string"
    )
    return given


def expected(batches: list[tuple[int, int]]) -> dict[str, Any]:
    """Each table's contents after ``(txid, variant)`` batches, computed here."""
    out: dict[str, Any] = {name: Counter() for name in NAMES}
    for txid, variant in batches:
        for name, rows in increments(txid, variant).items():
            for key, n in rows:
                out[name][key] += n
    out["dead_letters"] = Counter((f"raw{t}.{v}", "r", t) for t, v in batches)
    return out


def contents(frames: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, frame in frames.items():
        rows = frame.collect()
        if name == "dead_letters":
            out[name] = Counter((r.raw, r.reason, r.txid) for r in rows)
        else:
            out[name] = Counter({r.k: r["count"] for r in rows})
    return out


def snapshot_contents(snap: Any) -> dict[str, Any]:
    return contents({name: snap.table(name) for name in ALL})


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the tables are: a local directory, or a bucket of the S3 stand-in."""
    if request.param == "local":
        return str(tmp_path)
    return f"s3://{request.getfixturevalue('s3_bucket')}/delta"


def opened(
    spark: Any, path: Path | str, mode: CommitMode = CommitMode.TRANSACTIONAL
) -> DeltaCommitter:
    sink = DeltaCommitter(str(path), TABLES, dead_letters="bad", mode=mode)
    sink.open(CommitterContext(spark, "topo", "snap"))
    return sink


def commit(sink: DeltaCommitter, spark: Any, txid: int, attempt: int = 1, variant: int = 0) -> Any:
    at = TransactionAttempt(txid, attempt)
    return sink.commit(at, sink.prepare(at, inputs(spark, txid, variant)))


def snapshot(spark: Any, path: Path | str, txid: int | None = None) -> Any:
    return DeltaCommitter.snapshot(spark, str(path), "topo", "snap", ALL, txid=txid)


@pytest.mark.slow  # make test-slow: snapshots taken against a writer for over a minute
def test_every_snapshot_taken_while_a_writer_commits_is_one_txid(
    spark: Any, tmp_path: Path
) -> None:
    sink = opened(spark, tmp_path)
    last_txid = 12
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for txid in range(1, last_txid + 1):
                assert commit(sink, spark, txid) is CommitOutcome.APPLIED
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    writer = threading.Thread(target=write, name="writer")
    writer.start()
    seen: list[int] = []
    try:
        while writer.is_alive():
            try:
                snap = snapshot(spark, tmp_path)
            except ConfigurationError:  # no txid committed on every table yet
                time.sleep(0.2)
                continue
            assert snapshot_contents(snap) == expected([(t, 0) for t in range(1, snap.txid + 1)])
            seen.append(snap.txid)
    finally:
        writer.join()
    assert not failures, failures
    final = snapshot(spark, tmp_path)
    assert final.txid == last_txid
    assert snapshot_contents(final) == expected([(t, 0) for t in range(1, last_txid + 1)])
    assert seen == sorted(seen) and len(set(seen)) >= 3, seen  # it read while writing
    # Any earlier txid can still be read as it was.
    assert snapshot_contents(snapshot(spark, tmp_path, txid=4)) == expected(
        [(t, 0) for t in range(1, 5)]
    )


def test_a_commit_cut_short_between_tables_is_not_in_the_snapshot(
    spark: Any, tmp_path: Path
) -> None:
    sink = opened(spark, tmp_path)
    for txid in (1, 2):
        commit(sink, spark, txid)
    # Txid 3 reaches t0 only: its MERGE into t1 fails.
    at = TransactionAttempt(3, 1)
    good = sink.prepare(at, inputs(spark, 3))
    failing = broken(good.counters["t1"])
    with pytest.raises(CommitError, match="txid 3"):
        sink.commit(at, DeltaBatch(3, {**good.counters, "t1": failing}, good.dead_letters))
    latest = contents({name: spark.read.format("delta").load(sink.location(name)) for name in ALL})
    upto2, upto3 = expected([(1, 0), (2, 0)]), expected([(1, 0), (2, 0), (3, 0)])
    assert latest["t0"] == upto3["t0"] and latest["t1"] == upto2["t1"]  # a mixed read
    snap = snapshot(spark, tmp_path)
    assert snap.txid == 2 and snapshot_contents(snap) == upto2
    assert snapshot_contents(snapshot(spark, tmp_path, txid=1)) == expected([(1, 0)])
    with pytest.raises(ConfigurationError, match=r"txid 3 is not held by every table.*'t1': 2"):
        snapshot(spark, tmp_path, txid=3)
    # The replay completes txid 3 (t0 skips it): now the snapshot is txid 3.
    assert sink.commit(TransactionAttempt(3, 2), good) is CommitOutcome.APPLIED
    snap = snapshot(spark, tmp_path)
    assert snap.txid == 3 and snapshot_contents(snap) == upto3


@pytest.mark.rotated
def test_opaque_snapshots_read_only_final_txids_unless_asked(spark: Any, root: str) -> None:
    sink = opened(spark, root, CommitMode.OPAQUE)
    commit(sink, spark, 1)
    commit(sink, spark, 2)
    assert commit(sink, spark, 2, attempt=2, variant=1) is CommitOutcome.REAPPLIED
    # Txid 2 may still be rewritten by a replay: the latest final one is 1.
    snap = snapshot(spark, root)
    assert snap.txid == 1 and snapshot_contents(snap) == expected([(1, 0)])
    asked = snapshot(spark, root, txid=2)
    assert snapshot_contents(asked) == expected([(1, 0), (2, 1)])
    # Once a table holds txid 3, txid 2 is final: its last rewrite is what is read.
    at = TransactionAttempt(3, 1)
    good = sink.prepare(at, inputs(spark, 3))
    failing = broken(good.counters["t1"])
    with pytest.raises(CommitError):
        sink.commit(at, DeltaBatch(3, {**good.counters, "t1": failing}, good.dead_letters))
    snap = snapshot(spark, root)
    assert snap.txid == 2 and snapshot_contents(snap) == expected([(1, 0), (2, 1)])


def test_snapshot_errors_say_what_is_missing(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no Delta table at"):
        snapshot(spark, tmp_path)
    opened(spark, tmp_path)
    with pytest.raises(ConfigurationError, match="holds no txid of committer 'topo:snap'"):
        snapshot(spark, tmp_path)
    sink = opened(spark, tmp_path)
    commit(sink, spark, 1)
    with pytest.raises(ConfigurationError, match="holds no txid of committer 'topo:other'"):
        DeltaCommitter.snapshot(spark, str(tmp_path), "topo", "other", ALL)
    with pytest.raises(ConfigurationError, match="not in this snapshot"):
        snapshot(spark, tmp_path).table("nope")
