"""DeltaCommitter against real Delta tables on local disk, on both of its commit paths
(delta-rs from the driver, delta-spark's MERGE above ``max_driver_rows``): Delta's own
txn markers skip transactional replays, opaque replays undo and redo, and the
session-wide txn confs never outlive a commit. Kept to few MERGEs: each costs seconds on
the delta-spark path."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.fs as pa_fs
import pytest

from committers import CounterTable, DeltaCommitter
from committers.delta._committer import MAX_DRIVER_ROWS, DeltaBatch
from committers.delta._spark import TXN_APP_ID_CONF, TXN_VERSION_CONF
from committers.delta._target import DEAD_LETTERS_TABLE
from tests.integration.delta_faults import broken
from transactional.committer import CommitterContext
from transactional.errors import CommitError, ConfigurationError, FencedError
from transactional.testing.history import delta_log
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

pytestmark = [pytest.mark.integration, pytest.mark.connect]

TAGS = CounterTable("hashtags", ("tag",))
USER_TAGS = CounterTable("users_hashtags", ("user", "tag"))

Pairs = list[tuple[str | None, str]]


#: Both modes; on Connect the transactional one in make connect-test-full only (the
#: opaque mode's undo is the harder path, and both paths run it in make connect-test).
MODES = [pytest.param(CommitMode.TRANSACTIONAL, marks=pytest.mark.connect_full), CommitMode.OPAQUE]


@pytest.fixture(params=["delta-rs", "delta-spark"])
def driver_rows(request: pytest.FixtureRequest) -> int:
    """The commit path under test, as the committer's ``max_driver_rows``."""
    return MAX_DRIVER_ROWS if request.param == "delta-rs" else 0


def frames(spark: Any, user_tags: Pairs, dead: list[tuple[str, str]]) -> dict[str, Any]:
    """One row per occurrence with count 1, so the committer must sum duplicates."""
    return {
        "tags": spark.createDataFrame([(t, 1) for _, t in user_tags], "tag string, count long"),
        "user_tags": spark.createDataFrame(
            [(u, t, 1) for u, t in user_tags], "user string, tag string, count long"
        ),
        "bad": spark.createDataFrame(dead, "raw string, reason string"),
    }


def commit(
    committer: DeltaCommitter,
    spark: Any,
    txid: int,
    attempt: int,
    user_tags: Pairs,
    dead: Sequence[tuple[str, str]] = (),
) -> CommitOutcome:
    at = TransactionAttempt(txid, attempt)
    given = frames(spark, user_tags, list(dead))
    given = {k: v for k, v in given.items() if k in committer.counters or k == "bad"}
    return committer.commit(at, committer.prepare(at, given))


def read(spark: Any, committer: DeltaCommitter, table: CounterTable) -> dict[tuple[Any, ...], int]:
    rows = spark.read.format("delta").load(committer.location(table.name)).collect()
    return {tuple(r[k] for k in table.keys): r["count"] for r in rows}


def read_dead(spark: Any, committer: DeltaCommitter) -> Counter[tuple[str, str, int]]:
    rows = spark.read.format("delta").load(committer.location("dead_letters")).collect()
    return Counter((r.raw, r.reason, r.txid) for r in rows)


def confs_unset(spark: Any) -> bool:
    return spark.conf.get(TXN_APP_ID_CONF, None) is None and (
        spark.conf.get(TXN_VERSION_CONF, None) is None
    )


B1: Pairs = [("@x", "#a"), ("@x", "#a"), ("@y", "#b"), (None, "#a")]
B2: Pairs = [("@y", "#b"), ("@z", "#c")]
B3: Pairs = [("@x", "#a"), (None, "#a")]


@pytest.mark.rotated
def test_transactional_skips_replays_and_resumes_after_a_partial_commit(
    spark: Any, tmp_path: Path, driver_rows: int
) -> None:
    committer = DeltaCommitter(
        str(tmp_path),
        {"tags": TAGS, "user_tags": USER_TAGS},
        dead_letters="bad",
        max_driver_rows=driver_rows,
    )
    committer.open(CommitterContext(spark, "topo", "counts"))
    assert committer.committed_txid() is None

    # Txid 1 fails in the second table's MERGE: the first table and nothing else holds it,
    # and the txn confs are gone although the MERGE raised.
    at = TransactionAttempt(1, 1)
    good = committer.prepare(at, frames(spark, B1, [("{x", "json")]))
    broken_source = broken(good.counters["users_hashtags"])
    failing = DeltaBatch(1, {**good.counters, "users_hashtags": broken_source}, good.dead_letters)
    with pytest.raises(CommitError, match="txid 1"):
        committer.commit(at, failing)
    assert confs_unset(spark)
    assert committer.recorded_version("hashtags") == 1
    assert committer.committed_txid() is None

    # The replay skips the table already done and applies the rest.
    assert committer.commit(TransactionAttempt(1, 2), good) is CommitOutcome.APPLIED
    assert committer.committed_txid() == 1
    assert commit(committer, spark, 2, 1, B2) is CommitOutcome.APPLIED
    assert commit(committer, spark, 3, 1, B3, [("", "empty")]) is CommitOutcome.APPLIED
    assert confs_unset(spark)

    # Replays of 2 and of 3 (new attempt, other contents) change nothing.
    assert commit(committer, spark, 2, 2, B2) is CommitOutcome.SKIPPED
    assert commit(committer, spark, 3, 2, B1, [("zz", "zz")]) is CommitOutcome.SKIPPED
    all_pairs = B1 + B2 + B3
    assert read(spark, committer, TAGS) == {
        (t,): n for t, n in Counter(t for _, t in all_pairs).items()
    }
    assert read(spark, committer, USER_TAGS) == dict(Counter(all_pairs))
    assert read_dead(spark, committer) == Counter([("{x", "json", 1), ("", "empty", 3)])
    assert committer.committed_txid() == 3
    assert confs_unset(spark)
    for table in ("hashtags", "users_hashtags", "dead_letters"):
        assert spark_marker(spark, committer.location(table), f"topo:counts:{table}") == 3


def spark_marker(spark: Any, location: str, app_id: str) -> int:
    """The txid marker as delta-spark itself honours it: the highest ``txnVersion`` of
    ``app_id`` whose write Spark skips (an empty append of ``n`` makes no new version
    for every ``n`` up to it, and one for the next)."""

    def version() -> int:  # in SQL: a Connect server needs no Delta Connect plugin
        history = spark.sql(f"DESCRIBE HISTORY delta.`{location}` LIMIT 1")
        return int(history.collect()[0]["version"])

    empty = spark.read.format("delta").load(location).limit(0)
    n = 0
    while True:
        before = version()
        writer = empty.write.format("delta").option("txnAppId", app_id)
        writer.option("txnVersion", n + 1).mode("append").save(location)
        if version() != before:
            return n
        n += 1


def _opened(
    spark: Any, path: Path | str, mode: CommitMode, driver_rows: int, token: int | None = None
) -> DeltaCommitter:
    """A committer of ``user_tags`` with dead letters, opened (by a runner leading with
    fence token ``token``, if given)."""
    committer = DeltaCommitter(
        str(path),
        {"user_tags": USER_TAGS},
        dead_letters="bad",
        mode=mode,
        max_driver_rows=driver_rows,
    )
    committer.open(CommitterContext(spark, "topo", "counts", fence_token=token))
    return committer


@pytest.mark.rotated
def test_opaque_replay_undoes_the_earlier_attempt(
    spark: Any, tmp_path: Path, driver_rows: int
) -> None:
    committer = _opened(spark, tmp_path, CommitMode.OPAQUE, driver_rows)
    assert commit(committer, spark, 1, 1, B1, [("r0", "bad")]) is CommitOutcome.APPLIED
    first: Pairs = [("@x", "#a"), ("@y", "#b"), ("@n", "#new")]
    assert commit(committer, spark, 2, 1, first, [("r1", "bad"), ("r2", "bad")]) is (
        CommitOutcome.APPLIED
    )
    assert read(spark, committer, USER_TAGS) == dict(Counter(B1 + first))

    # The replay drops ("@n", "#new"), created by the first attempt (must vanish), and
    # ("@y", "#b"), which existed before txid 2 (back to its txid-1 value).
    second: Pairs = [("@x", "#a"), ("@x", "#a"), ("@z", "#c")]
    assert commit(committer, spark, 2, 2, second, [("r3", "worse")]) is CommitOutcome.REAPPLIED
    counts = read(spark, committer, USER_TAGS)
    assert counts == dict(Counter(B1 + second))
    assert ("@n", "#new") not in counts and counts[("@y", "#b")] == 1
    assert read_dead(spark, committer) == Counter([("r0", "bad", 1), ("r3", "worse", 2)])
    assert confs_unset(spark)

    with pytest.raises(CommitError, match=r"txid 1 .*holds txid 2"):
        commit(committer, spark, 1, 2, B1)
    assert commit(committer, spark, 3, 1, B3) is CommitOutcome.APPLIED
    assert read(spark, committer, USER_TAGS) == dict(Counter(B1 + second + B3))
    assert committer.committed_txid() == 3
    assert read_dead(spark, committer) == Counter([("r0", "bad", 1), ("r3", "worse", 2)])

    # A transactional committer must not take over tables written in opaque mode, and an
    # unusable path fails at open, naming it.
    other = DeltaCommitter(str(tmp_path), {"user_tags": USER_TAGS})
    with pytest.raises(ConfigurationError, match="opaque-mode columns"):
        other.open(CommitterContext(spark, "topo", "counts"))
    unusable = DeltaCommitter("/proc/no-such-dir", {"user_tags": USER_TAGS})
    with pytest.raises(ConfigurationError, match="/proc/no-such-dir/users_hashtags"):
        unusable.open(CommitterContext(spark, "topo", "counts"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.rotated
def test_a_group_is_one_merge_per_table_and_its_replay_exact(
    spark: Any, tmp_path: Path, driver_rows: int, mode: CommitMode
) -> None:
    committer = _opened(spark, tmp_path, mode, driver_rows)
    assert commit(committer, spark, 1, 1, B1, [("r0", "bad")]) is CommitOutcome.APPLIED
    from deltalake import DeltaTable

    table = committer.location(USER_TAGS.name)
    before = DeltaTable(table).version()

    def group(batches: list[tuple[Pairs, list[tuple[str, str]]] | None], attempt: int) -> Any:
        attempts = [TransactionAttempt(t, attempt) for t in (2, 3)]
        prepared = []
        for at, b in zip(attempts, batches, strict=True):
            given = None if b is None else frames(spark, b[0], b[1])
            if given is not None:
                given = {k: v for k, v in given.items() if k in ("user_tags", "bad")}
            prepared.append(None if given is None else committer.prepare(at, given))
        return committer.commit_group(attempts, prepared)

    two: Pairs = [("@x", "#a"), ("@n", "#new")]
    three: Pairs = [("@y", "#b"), ("@x", "#a")]
    assert group([(two, [("r1", "bad")]), (three, [("r2", "bad")])], 1) is CommitOutcome.APPLIED
    assert DeltaTable(table).version() == before + 1  # one MERGE for both txids
    assert read(spark, committer, USER_TAGS) == dict(Counter(B1 + two + three))
    assert read_dead(spark, committer) == Counter(
        [("r0", "bad", 1), ("r1", "bad", 2), ("r2", "bad", 3)]
    )
    assert committer.committed_txid() == 3
    # The group again, after a crash: txid 2 now without ("@n", "#new"), txid 3 empty.
    second: Pairs = [("@z", "#c")]
    outcome = group([(second, [("r3", "worse")]), None], 2)
    if mode is CommitMode.TRANSACTIONAL:  # the sink holds txid 3: the group is skipped
        assert outcome is CommitOutcome.SKIPPED
        assert read(spark, committer, USER_TAGS) == dict(Counter(B1 + two + three))
    else:  # undone (the new key and the dead letters too), then applied
        assert outcome is CommitOutcome.REAPPLIED
        counts = read(spark, committer, USER_TAGS)
        assert counts == dict(Counter(B1 + second)) and ("@n", "#new") not in counts
        assert read_dead(spark, committer) == Counter([("r0", "bad", 1), ("r3", "worse", 2)])
    assert committer.committed_txid() == 3
    assert confs_unset(spark)


def test_open_creates_plain_delta_tables_that_delta_spark_reads_with_the_declared_types(
    spark: Any, tmp_path: Path
) -> None:
    """Tables are created with delta-rs where it can (a local path, plain types): what
    delta-spark reads back is the declared schema, nullability included, at protocol
    reader 1 / writer 2; a directory of other files is refused, not taken over."""
    amounts = CounterTable(
        "amounts", ("day", "shop"), value_type="decimal(20,4)", key_types={"day": "date"}
    )
    tags = CounterTable("tags", ("tag",))
    committer = DeltaCommitter(
        str(tmp_path), {"amounts": amounts, "tags": tags}, "bad", mode=CommitMode.OPAQUE
    )
    committer.open(CommitterContext(spark, "topo", "counts"))
    committer.close()
    expected = {
        "amounts": "day date, shop string, count decimal(20,4) not null, prev decimal(20,4), "
        "txid bigint not null",
        "tags": "tag string, count bigint not null, prev bigint, txid bigint not null",
        "dead_letters": "raw string, reason string, txid bigint not null",
    }
    from deltalake import DeltaTable

    for name, ddl in expected.items():
        location = committer.location(name)
        schema = spark.read.format("delta").load(location).schema
        got = ", ".join(
            f"{f.name} {f.dataType.simpleString()}{'' if f.nullable else ' not null'}"
            for f in schema.fields
        )
        assert got == ddl
        protocol = DeltaTable(location).protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    # Opening again finds the tables and changes nothing.
    again = DeltaCommitter(
        str(tmp_path), {"amounts": amounts, "tags": tags}, "bad", mode=CommitMode.OPAQUE
    )
    again.open(CommitterContext(spark, "topo", "counts"))
    again.close()
    assert DeltaTable(committer.location("tags")).version() == 0

    other = tmp_path / "other"
    (other / "tags").mkdir(parents=True)
    (other / "tags" / "notes.txt").write_text("not a table")
    taken = DeltaCommitter(str(other), {"tags": tags})
    with pytest.raises(ConfigurationError, match=r"holds files but no Delta table"):
        taken.open(CommitterContext(spark, "topo", "counts"))
    assert sorted(p.name for p in (other / "tags").iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.rotated
def test_a_table_of_many_small_commits_is_compacted_and_stays_exact(
    spark: Any, tmp_path: Path, mode: CommitMode
) -> None:
    """Every txid brings only new keys, so each adds a file (a MERGE rewrites only the
    files of keys it matches); past ``compact_files`` the
    committer compacts (an OPTIMIZE in the table's own history), the table's files stay
    few, and the counts, the markers, replays and snapshots before the compaction stay
    exact."""
    from deltalake import DeltaTable

    limit = 3
    committer = DeltaCommitter(
        str(tmp_path), {"user_tags": USER_TAGS}, dead_letters="bad", mode=mode, compact_files=limit
    )
    committer.open(CommitterContext(spark, "topo", "counts"))
    batches: dict[int, Pairs] = {
        txid: [(f"@u{txid}", "#a"), (f"@u{txid}", f"#t{txid}"), (f"@u{txid}", "#a")]
        for txid in range(1, 11)
    }
    for txid, pairs in batches.items():
        assert commit(committer, spark, txid, 1, pairs, [(f"r{txid}", "bad")]) is (
            CommitOutcome.APPLIED
        )
        for table in ("users_hashtags", "dead_letters"):
            assert len(DeltaTable(committer.location(table)).file_uris()) <= limit + 1, (
                txid,
                table,
            )
    for table in ("users_hashtags", "dead_letters"):
        history = DeltaTable(committer.location(table)).history()
        assert any(h["operation"] == "OPTIMIZE" for h in history), (table, history)
    expected = Counter(p for pairs in batches.values() for p in pairs)
    assert read(spark, committer, USER_TAGS) == dict(expected)
    assert read_dead(spark, committer) == Counter((f"r{t}", "bad", t) for t in batches)
    assert committer.committed_txid() == 10

    # A replay of the last txid after the compactions: skipped, or undone and redone.
    again = commit(committer, spark, 10, 2, [("@x", "#z")])
    if mode is CommitMode.OPAQUE:
        assert again is CommitOutcome.REAPPLIED
        expected = expected - Counter(batches[10]) + Counter([("@x", "#z")])
    else:
        assert again is CommitOutcome.SKIPPED
    assert read(spark, committer, USER_TAGS) == dict(expected)
    # A snapshot as of txid 2 (before any compaction) reads that txid's counts.
    early = DeltaCommitter.snapshot(spark, str(tmp_path), "topo", "counts", ["users_hashtags"], 2)
    early = early.table("users_hashtags").collect()
    assert {(r["user"], r["tag"]): r["count"] for r in early} == dict(
        Counter(batches[1] + batches[2])
    )


def test_compact_files_must_be_a_count(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"compact_files must be an integer >= 0 .*'3'"):
        DeltaCommitter(str(tmp_path), {"user_tags": USER_TAGS}, compact_files="3")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.rotated
def test_a_deposed_leader_never_applies_a_txid_twice(
    spark: Any, tmp_path: Path, driver_rows: int, mode: CommitMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader (token 1) is deposed while its commit of txid 2 is under way: past its
    leadership check, its table caught up and its marker decided, its write not landed.
    The new leader (token 2) commits txid 2 and 3 meanwhile. The old write must fail, and
    every later attempt of the old leader be refused with ``FencedError``, writing
    nothing; the tables keep each txid's effect once."""
    deposed_mid_commit(spark, str(tmp_path), driver_rows, mode, monkeypatch)


@pytest.mark.parametrize("mode", list(CommitMode))
def test_in_s3_a_deposed_leader_never_applies_a_txid_twice(
    spark: Any, s3_bucket: str, mode: CommitMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same in a bucket of the S3 stand-in, where delta-rs is the only writer."""
    deposed_mid_commit(spark, f"s3://{s3_bucket}/delta", MAX_DRIVER_ROWS, mode, monkeypatch)


def deposed_mid_commit(
    spark: Any, root: str, driver_rows: int, mode: CommitMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake import DeltaTable

    from committers.delta._rs import DriverWriter
    from committers.delta._spark import ExecutorWriter

    old = _opened(spark, root, mode, driver_rows, token=1)
    assert commit(old, spark, 1, 1, B1, [("r1", "bad")]) is CommitOutcome.APPLIED
    new = _opened(spark, root, mode, driver_rows, token=2)

    def new_leader_commits() -> None:
        assert commit(new, spark, 2, 2, B2, [("r2", "bad")]) is CommitOutcome.APPLIED
        assert commit(new, spark, 3, 1, B3) is CommitOutcome.APPLIED

    # The old leader's write of txid 2 is decided when the new leader takes over.
    decide = "_marker" if driver_rows else "_next_version"
    writer = DriverWriter if driver_rows else ExecutorWriter
    original = getattr(writer, decide)
    taken_over: list[bool] = []

    def decided_then_deposed(self: Any, *args: Any) -> Any:
        decided = original(self, *args)
        if not taken_over:
            taken_over.append(True)
            new_leader_commits()
        return decided

    monkeypatch.setattr(writer, decide, decided_then_deposed)
    location = old.location(USER_TAGS.name)
    with pytest.raises((CommitError, FencedError)):
        commit(old, spark, 2, 1, [("@old", "#late")], [("old", "late")])
    assert taken_over == [True]
    monkeypatch.setattr(writer, decide, original)
    versions = DeltaTable(location).version()
    # Every later attempt is refused before it writes anything.
    for txid in (2, 3, 4):
        with pytest.raises(FencedError, match=r"claimed by fence token 2, this runner's is 1"):
            commit(old, spark, txid, 2, [("@old", "#late")], [("old", "late")])
    assert DeltaTable(location).version() == versions
    assert read(spark, new, USER_TAGS) == dict(Counter(B1 + B2 + B3))
    assert read_dead(spark, new) == Counter([("r1", "bad", 1), ("r2", "bad", 2)])
    assert new.committed_txid() == 3
    # Each table's own history, read from its log: every commit that wrote rows says
    # under which token (its ``userMetadata``), the old leader's all before the new one's.
    for table in (USER_TAGS.name, DEAD_LETTERS_TABLE):
        fs, path = pa_fs.FileSystem.from_uri(new.location(table))
        log = delta_log(fs, f"{path}/_delta_log")
        wrote = [c.fence for c in log if c.changes]
        assert wrote == sorted(wrote) and set(wrote) == {1, 2}, (table, log)


def test_in_s3_a_txid_too_large_for_the_driver_is_refused_and_nothing_is_written(
    spark: Any, s3_bucket: str
) -> None:
    """In S3 only delta-rs commits (conditional writes); delta-spark's MERGE, the path of
    a table whose sums pass ``max_driver_rows``, is refused there before anything is
    written, saying what to change. Txid 1 (2 keys) commits; txid 2 (3 keys, over the
    limit of 2) stops with a ``ConfigurationError``, and the table, read by
    ``deltalake`` and by delta-spark (its rows and its txid marker), still holds txid 1
    alone."""
    from deltalake import DeltaTable

    committer = DeltaCommitter(
        f"s3://{s3_bucket}/delta", {"tags": TAGS}, dead_letters="bad", max_driver_rows=2
    )
    committer.open(CommitterContext(spark, "topo", "counts"))
    assert commit(committer, spark, 1, 1, [("@x", "#a"), ("@x", "#b"), ("@y", "#a")]) is (
        CommitOutcome.APPLIED
    )
    table = DeltaTable(committer.location("hashtags"))
    version = table.version()
    too_many: Pairs = [("@x", "#a"), ("@x", "#c"), ("@y", "#d")]
    with pytest.raises(
        ConfigurationError, match=r"txid 2 brings more than max_driver_rows \(2\) rows .*raise"
    ):
        commit(committer, spark, 2, 1, too_many)
    table.update_incremental()
    assert table.version() == version
    counts = {r["tag"]: r["count"] for r in table.to_pyarrow_table().to_pylist()}
    assert counts == {"#a": 2, "#b": 1}
    assert committer.committed_txid() == 1
    committer.close()
    # delta-spark reads the table and honours its marker (last: this writes to it).
    assert read(spark, committer, TAGS) == {("#a",): 2, ("#b",): 1}
    assert spark_marker(spark, committer.location("hashtags"), "topo:counts:hashtags") == 1


def test_a_writer_catches_up_with_commits_another_writer_made(spark: Any, tmp_path: Path) -> None:
    """The driver's writer reads a local table's log only when a commit after the version
    it holds exists (``DriverWriter._caught_up``): two committers of one topology, each
    with its table loaded at open, commit txids 1 to 4 in turn, every commit on a table
    the other has moved on. Each sees the other's marker (no txid applied twice, none
    refused as stale), and the table holds every batch once, as Spark reads it."""
    from deltalake import DeltaTable

    first = _opened(spark, tmp_path, CommitMode.TRANSACTIONAL, MAX_DRIVER_ROWS)
    second = _opened(spark, tmp_path, CommitMode.TRANSACTIONAL, MAX_DRIVER_ROWS)
    batches = [B1, B2, B3, B1]
    for txid, batch in enumerate(batches, start=1):
        writer = first if txid % 2 else second
        assert commit(writer, spark, txid, 1, batch, [(f"r{txid}", "bad")]) is (
            CommitOutcome.APPLIED
        )
        # The txid again from the other committer: its marker is seen, nothing written.
        other = second if writer is first else first
        before = DeltaTable(first.location(USER_TAGS.name)).version()
        assert commit(other, spark, txid, 1, batch) is CommitOutcome.SKIPPED
        assert DeltaTable(first.location(USER_TAGS.name)).version() == before
    expected = Counter(pair for batch in batches for pair in batch)
    assert read(spark, first, USER_TAGS) == dict(expected)
    assert read_dead(spark, first) == Counter((f"r{t}", "bad", t) for t in range(1, 5))
    assert first.committed_txid() == second.committed_txid() == 4
