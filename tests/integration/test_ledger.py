"""The record ledger on real Spark: a bolt that accounts for its records and still loses
or duplicates some fails its txid before anything is committed, naming the bolt, the
stream and the exact number (computed here, without Spark); a bolt that accounts and
balances, the tweet demo among them, commits as before with no Spark job added; a bolt
that does not account runs unchanged, named once at start."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from examples.tweets.bolts import DEAD_LETTERS, HASHTAGS, USERS, USERS_HASHTAGS
from examples.tweets.generate import generate
from examples.tweets.sinks import make_committer
from examples.tweets.topology import build_topology
from tests.integration.topologies import RangeSpout
from transactional import (
    BatchConfigurationError,
    Bolt,
    CommitOutcome,
    Committer,
    ConfigurationError,
    TopologyBuilder,
)
from transactional.bolt import DEFAULT_STREAM
from transactional.ledger import (
    COLUMNS,
    ID,
    LedgerError,
    drop,
    drop_where,
    folded,
)
from transactional.runtime.ledger_books import AttemptLedger
from transactional.sources.files import FilesPartitionedSpout
from transactional.testing import TopologyHarness
from transactional.types import CommitMode, TransactionAttempt

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

pytestmark = [pytest.mark.integration, pytest.mark.connect]

TOTAL, BATCH = 40, 20
#: The first txid's numbers: the one a failing bolt fails on (max_pending=1).
FIRST = range(0, BATCH)


class RowsCommitter(Committer):
    """Every committed row of each input, collected through ``collect_plan`` (the path of
    the ready-made committers: the ledger's totals come out of these jobs)."""

    def __init__(self) -> None:
        self.last_txid = 0
        self.rows: dict[str, list[dict[str, Any]]] = {}
        self.columns: set[str] = set()

    def collect_plan(
        self, attempt: TransactionAttempt, inputs: Mapping[str, DataFrame]
    ) -> Mapping[str, DataFrame]:
        return dict(inputs)

    def prepare_collected(
        self, attempt: TransactionAttempt, inputs: Mapping[str, DataFrame], collected: Any
    ) -> Any:
        for frame in inputs.values():
            self.columns.update(frame.columns)
        return {name: table.to_pylist() for name, table in collected.items()}

    def commit(self, attempt: TransactionAttempt, prepared: Any) -> CommitOutcome:
        if attempt.txid <= self.last_txid:
            return CommitOutcome.SKIPPED
        for name, rows in prepared.items():
            self.rows.setdefault(name, []).extend(rows)
        self.last_txid = attempt.txid
        return CommitOutcome.APPLIED

    def committed_txid(self) -> int | None:
        return self.last_txid


class Lossy(Bolt):
    """Leaves out every fifth number, and says nothing of them."""

    accounts = True

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        return batch.where(F.col("id") % 5 != 0)


class DuplicatingJoin(Bolt):
    """Labels each number by its remainder mod 3: remainder 0 has two labels, so a left
    join gives those rows twice."""

    accounts = True

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        labels = batch.sparkSession.createDataFrame(
            [(0, "zero"), (0, "nought"), (1, "one"), (2, "two")], "k LONG, label STRING"
        )
        keyed = batch.withColumn("k", F.col("id") % 3)
        return keyed.join(labels, "k", "left").drop("k")


class Swapping(Bolt):
    """Loses number 0 of each batch and gives number 1 twice: as many records out as in,
    not the same ones."""

    accounts = True

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        first = F.col("id") % BATCH
        return batch.where(first != 0).unionByName(batch.where(first == 1))


class ForgottenBranch(Bolt):
    """Small numbers one way, big ones the other, and the middle forgotten."""

    outputs = ("small", "big")
    accounts = True

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> dict[str, DataFrame]:
        return {
            "small": batch.where(F.col("id") % BATCH < 5),
            "big": batch.where(F.col("id") % BATCH >= 10),
        }


class Balanced(Bolt):
    """Every form of accounting at once, on two routes: evens carried and odds dropped;
    odds above 30 folded into sums by remainder mod 3 and the rest dropped."""

    outputs = ("evens", "sums")
    accounts = True
    routes = (("evens",), ("sums",))

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> dict[str, DataFrame]:
        even = F.col("id") % 2 == 0
        drop(batch.where(~even), "odd", stream="evens")
        drop(batch.where(even | (F.col("id") <= 30)), "not an odd above 30", stream="sums")
        odds = batch.where(~even & (F.col("id") > 30))
        return {
            "evens": batch.where(even).withColumn("half", F.col("id") / 2),
            "sums": odds.groupBy((F.col("id") % 3).alias("r")).agg(
                F.sum("id").alias("s"), *folded()
            ),
        }


class Plain(Bolt):
    """A user's filter that does not account: what it sees and gives must not change."""

    seen: ClassVar[list[list[str]]] = []

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        Plain.seen.append(batch.columns)
        return batch.where(F.col("id") % 5 != 0)


def harness(
    spark: Any,
    tmp_path: Path,
    bolt: Bolt,
    sink: RowsCommitter,
    spout: Callable[[], Any] = lambda: RangeSpout(TOTAL, BATCH),
    **config: Any,
) -> Any:
    outputs = tuple(bolt.outputs)

    def build() -> Any:
        builder = TopologyBuilder().set_spout(spout()).set_bolt("b", bolt)
        inputs = {s: f"b:{s}" for s in outputs}
        return builder.set_committer("sink", sink, inputs).build()

    return TopologyHarness(build, spark, topology_id="ledger", state_dir=tmp_path, **config)


def failed_ledger(
    spark: Any, tmp_path: Path, bolt: Bolt, **spout: Any
) -> tuple[LedgerError, RowsCommitter]:
    sink = RowsCommitter()
    with pytest.raises(BatchConfigurationError) as caught:
        harness(spark, tmp_path, bolt, sink, **spout).run_until_drained(
            max_pending=1, warm_up=False
        )
    cause = caught.value.cause
    assert isinstance(cause, LedgerError), cause
    assert caught.value.txid == 1 and cause.txid == 1
    return cause, sink


def test_a_lossy_bolt_fails_its_txid_and_nothing_is_committed(spark: Any, tmp_path: Path) -> None:
    error, sink = failed_ledger(spark, tmp_path, Lossy())
    lost = [n for n in FIRST if n % 5 == 0]
    assert (error.given, error.accounted, error.unaccounted) == (BATCH, BATCH - len(lost), 4)
    assert error.streams == (DEFAULT_STREAM,)
    # RangeSpout names no position_columns: each record is named by its values.
    named = ", ".join(f"id={n}" for n in lost)
    assert (
        f"bolt 'b' ({__name__}.Lossy) on stream 'default', txid 1: 4 record(s) unaccounted "
        f"for ({named}); given 20"
    ) in str(error)
    assert sink.last_txid == 0 and sink.rows == {}


def test_a_duplicating_join_fails_its_txid(spark: Any, tmp_path: Path) -> None:
    error, sink = failed_ledger(spark, tmp_path, DuplicatingJoin())
    twice = [n for n in FIRST if n % 3 == 0]
    assert len(twice) == 7
    assert (error.given, error.accounted, error.unaccounted) == (BATCH, BATCH + 7, -7)
    assert (error.named, error.miscounted) == (
        tuple(f"id={n}: 2 times" for n in twice[:5]),
        7,
    )
    named = ", ".join(error.named)
    assert (
        f"on stream 'default', txid 1: 7 record(s) accounted for more than once ({named} and "
        "2 more); given 20"
    ) in str(error)
    assert sink.last_txid == 0 and sink.rows == {}


def test_a_bolt_that_swaps_one_record_for_another_fails_its_txid(
    spark: Any, tmp_path: Path
) -> None:
    """The counts balance; only the XOR of the ids tells the swap."""
    error, sink = failed_ledger(spark, tmp_path, Swapping())
    assert (error.given, error.accounted, error.unaccounted) == (BATCH, BATCH, 0)
    assert "as many records accounted for as given, but not the same ones" in str(error)
    assert sink.last_txid == 0 and sink.rows == {}


def test_a_filter_that_forgot_a_branch_fails_its_txid(spark: Any, tmp_path: Path) -> None:
    error, sink = failed_ledger(spark, tmp_path, ForgottenBranch())
    forgotten = [n for n in FIRST if 5 <= n % BATCH < 10]
    assert (error.unaccounted, error.streams) == (len(forgotten), ("small", "big"))
    assert (error.named, error.miscounted) == (tuple(f"id={n}" for n in forgotten), 5)
    assert "streams 'small' and 'big' together, txid 1: 5 record(s)" in str(error)
    assert sink.last_txid == 0 and sink.rows == {}


def recounts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The txids whose observed totals had to be recounted (none, when the committers'
    jobs gave every total)."""
    calls: list[int] = []
    original = AttemptLedger._recount

    def spy(self: AttemptLedger) -> None:
        calls.append(self.txid)
        original(self)

    monkeypatch.setattr(AttemptLedger, "_recount", spy)
    return calls


def assert_balanced(sink: RowsCommitter, total: int) -> None:
    """``Balanced``'s streams of the numbers below ``total``, as Python computes them."""
    evens = sorted((n, n / 2) for n in range(total) if n % 2 == 0)
    assert sorted((r["id"], r["half"]) for r in sink.rows["evens"]) == evens
    sums: Counter[int] = Counter()
    for n in range(31, total, 2):
        sums[n % 3] += n
    got: Counter[int] = Counter()
    for r in sink.rows["sums"]:
        got[r["r"]] += r["s"]
    assert got == sums


def test_carried_folded_and_dropped_records_balance(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recounted = recounts(monkeypatch)
    sink = RowsCommitter()
    run = harness(spark, tmp_path, Balanced(), sink).run_until_drained()
    assert run.stats.failures == 0 and sink.last_txid == TOTAL // BATCH
    assert_balanced(sink, TOTAL)
    assert not sink.columns & set(COLUMNS)  # no ledger column reached the committer
    assert recounted == []


class Marks(Bolt):
    """Carries every number on, marking multiples of 4 dropped in the stream itself;
    ``lose``: also leaves out multiples of 5 and says nothing of them."""

    accounts = True

    def __init__(self, lose: bool = False) -> None:
        self.lose = lose

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        kept = batch.where(F.col("id") % 5 != 0) if self.lose else batch
        return drop_where(kept, F.col("id") % 4 == 0, "a multiple of 4")


class SumsByRemainder(Bolt):
    """Folds what it is given into sums by remainder mod 3, and drops the group of
    remainder 2 (after folding it)."""

    accounts = True
    seen: ClassVar[list[list[str]]] = []

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        SumsByRemainder.seen.append(batch.columns)
        sums = batch.groupBy((F.col("id") % 3).alias("r")).agg(F.sum("id").alias("s"), *folded())
        return drop_where(sums, F.col("r") == 2, "remainder 2")


def chain(spark: Any, tmp_path: Path, sink: RowsCommitter, **config: Any) -> Any:
    """spout -> marks -> (sums, plain) -> sink: a marked stream read by an accounting
    bolt, a bolt that does not account, and a committer."""

    def build() -> Any:
        return (
            TopologyBuilder()
            .set_spout(RangeSpout(TOTAL, BATCH))
            .set_bolt("marks", Marks())
            .set_bolt("sums", SumsByRemainder(), "marks")
            .set_bolt("plain", Plain(), "marks")
            .set_committer("sink", sink, {"marked": "marks", "sums": "sums", "plain": "plain"})
            .build()
        )

    return TopologyHarness(build, spark, topology_id="marks", state_dir=tmp_path, **config)


@pytest.mark.parametrize("on", [True, False], ids=["ledger on", "ledger off"])
def test_rows_marked_dropped_reach_no_sink_and_no_bolt_and_balance(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on: bool
) -> None:
    recounted = recounts(monkeypatch)
    Plain.seen.clear()
    SumsByRemainder.seen.clear()
    sink = RowsCommitter()
    run = chain(spark, tmp_path, sink, ledger=on).run_until_drained(max_pending=1)
    assert run.stats.failures == 0 and sink.last_txid == TOTAL // BATCH
    kept = [n for n in range(TOTAL) if n % 4 != 0]
    assert sorted(r["id"] for r in sink.rows["marked"]) == kept
    assert sorted(r["id"] for r in sink.rows["plain"]) == [n for n in kept if n % 5 != 0]
    sums: Counter[int] = Counter()
    for n in kept:
        if n % 3 != 2:
            sums[n % 3] += n
    got: Counter[int] = Counter()
    for r in sink.rows["sums"]:
        got[r["r"]] += r["s"]
    assert got == sums
    assert Plain.seen == [["id"]] * (TOTAL // BATCH)  # neither the ledger's columns nor the mark
    assert not sink.columns & set(COLUMNS)
    # Every tally, the marked rows' too, came out of the committer's jobs.
    assert recounted == []


def test_a_bolt_that_marks_some_rows_and_loses_others_fails_its_txid(
    spark: Any, tmp_path: Path
) -> None:
    error, sink = failed_ledger(spark, tmp_path, Marks(lose=True))
    lost = [n for n in FIRST if n % 5 == 0]  # multiples of 4 among them too: lost, not marked
    assert (error.given, error.unaccounted) == (BATCH, len(lost))
    assert (error.named, error.miscounted) == (tuple(f"id={n}" for n in lost), len(lost))
    assert sink.last_txid == 0 and sink.rows == {}


def test_a_lossy_bolt_behind_another_names_what_it_lost(spark: Any, tmp_path: Path) -> None:
    """Its input is a stream of a checked bolt (the rows that bolt marked dropped left
    out); the records it lost are found in the batch by their ids."""
    sink = RowsCommitter()

    def build() -> Any:
        return (
            TopologyBuilder()
            .set_spout(RangeSpout(TOTAL, BATCH))
            .set_bolt("marks", Marks())
            .set_bolt("b", Lossy(), "marks")
            .set_committer("sink", sink, "b")
            .build()
        )

    with pytest.raises(BatchConfigurationError) as caught:
        TopologyHarness(build, spark, topology_id="behind", state_dir=tmp_path).run_until_drained(
            max_pending=1
        )
    error = caught.value.cause
    assert isinstance(error, LedgerError), error
    lost = [n for n in FIRST if n % 5 == 0 and n % 4 != 0]  # marks drops multiples of 4
    assert (error.source, error.unaccounted) == ("stream marks:default", len(lost))
    assert (error.named, error.miscounted) == (tuple(f"id={n}" for n in lost), len(lost))
    assert sink.last_txid == 0 and sink.rows == {}


class FoldsAllButSeven(Bolt):
    """Folds every number but 7 into sums by remainder mod 3, and says nothing of 7."""

    accounts = True

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        kept = batch.where(F.col("id") != 7)
        return kept.groupBy((F.col("id") % 3).alias("r")).agg(F.sum("id").alias("s"), *folded())


def test_one_record_lost_by_a_bolt_that_folds_is_named(spark: Any, tmp_path: Path) -> None:
    """A folded record has no id of its own, but the tallies' XOR is the lost one's."""
    error, sink = failed_ledger(spark, tmp_path, FoldsAllButSeven())
    assert (error.unaccounted, error.named, error.miscounted) == (1, ("id=7",), 1)
    assert "1 record(s) unaccounted for (id=7); given 20" in str(error)
    assert sink.last_txid == 0 and sink.rows == {}


class LeavesOut(Bolt):
    """Leaves out the records whose line is one of ``lines``, and says nothing of them."""

    accounts = True

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        return batch.where(~F.col("raw").isin(self.lines))


def test_a_lossy_bolt_over_files_names_the_lines_it_lost(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "in"
    root.mkdir()
    files = {
        name: [json.dumps({"user": f"u{n % 3}", "n": n, "in": name}) for n in range(8)]
        for name in ("part-0.jsonl", "part-1.jsonl")
    }
    for name, lines in files.items():
        (root / name).write_text("".join(f"{line}\n" for line in lines))
    removed = [files["part-0.jsonl"][i] for i in (2, 5)]
    removed += [files["part-1.jsonl"][i] for i in (0, 3, 6, 7)]
    # Each removed line's file and line number (from 1), from what was written: the five
    # named are the first by their text, in file and line order.
    line_of = {line: (name, n) for name, lines in files.items() for n, line in enumerate(lines, 1)}
    named = sorted(line_of[line] for line in sorted(removed)[:5])
    assert named == [("part-0.jsonl", 3), *(("part-1.jsonl", n) for n in (1, 4, 7, 8))]
    error, sink = failed_ledger(
        spark,
        tmp_path / "state",
        LeavesOut(removed),
        spout=lambda: FilesPartitionedSpout(root, batch_size=8),
    )
    assert (error.given, error.unaccounted, error.miscounted) == (16, 6, 6)
    # No position column: the spout finds each lost record's line in the txid's ranges.
    assert error.named == tuple(f"file {name} line {n}" for name, n in named)
    assert (
        "6 record(s) unaccounted for (file part-0.jsonl line 3, file part-1.jsonl line 1, "
        "file part-1.jsonl line 4, file part-1.jsonl line 7, file part-1.jsonl line 8 and "
        "1 more); given 16"
    ) in str(error)
    assert sink.last_txid == 0 and sink.rows == {}

    # The warm-up (txid 0) meets it first, in its sample: the first file's first lines.
    sink = RowsCommitter()
    run = harness(
        spark,
        tmp_path / "warm",
        LeavesOut(removed),
        sink,
        spout=lambda: FilesPartitionedSpout(root, batch_size=8),
    )
    with pytest.raises(LedgerError) as caught:
        run.run_until_drained(max_pending=1, warm_up=True)
    assert caught.value.txid == 0
    assert caught.value.named == ("file part-0.jsonl line 3", "file part-0.jsonl line 6")
    assert sink.last_txid == 0 and sink.rows == {}


class MarksUnaccounted(Bolt):
    """Calls drop_where but does not account for its records: a filter."""

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        return drop_where(batch, F.col("id") % 4 == 0, "a multiple of 4")


def test_drop_where_outside_the_ledger_is_a_filter(spark: Any, tmp_path: Path) -> None:
    """Outside a runner (a bolt's own test), and in a bolt that does not account."""
    frame = spark.range(10)
    left = drop_where(frame, F.col("id") % 4 == 0, "a multiple of 4")
    assert sorted(r["id"] for r in left.collect()) == [1, 2, 3, 5, 6, 7, 9]
    assert left.columns == ["id"]
    sink = RowsCommitter()
    run = harness(spark, tmp_path, MarksUnaccounted(), sink).run_until_drained(max_pending=1)
    assert run.stats.failures == 0
    assert sorted(r["id"] for r in sink.rows["default"]) == [n for n in range(TOTAL) if n % 4]
    assert sink.columns == {"id"}


def test_ledger_off_lets_a_lossy_bolt_commit(spark: Any, tmp_path: Path) -> None:
    sink = RowsCommitter()
    run = harness(spark, tmp_path, Lossy(), sink, ledger=False).run_until_drained()
    assert run.stats.failures == 0
    assert sorted(r["id"] for r in sink.rows["default"]) == [n for n in range(TOTAL) if n % 5 != 0]
    assert not sink.columns & set(COLUMNS)


def test_a_bolt_that_does_not_account_runs_unchanged_and_is_named_once(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    Plain.seen.clear()
    sink = RowsCommitter()
    with caplog.at_level(logging.WARNING, logger="transactional.ledger"):
        run = harness(spark, tmp_path, Plain(), sink).run_until_drained()
    assert run.stats.failures == 0
    assert sorted(r["id"] for r in sink.rows["default"]) == [n for n in range(TOTAL) if n % 5 != 0]
    assert Plain.seen == [["id"]] * (TOTAL // BATCH)  # the spout's columns, as before
    assert sink.columns == {"id"}
    said = [r.getMessage() for r in caplog.records if r.name == "transactional.ledger"]
    assert len(said) == 1
    assert f"bolt 'b' ({__name__}.Plain) does not account for its records" in said[0]
    assert "set accounts = True" in said[0]

    strict = RowsCommitter()
    with pytest.raises(ConfigurationError, match=r"ledger cannot check bolt 'b'.*--ledger-strict"):
        harness(spark, tmp_path / "strict", Plain(), strict, ledger_strict=True).run_until_drained()
    assert strict.last_txid == 0


@pytest.fixture(scope="module")
def tweets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ledger-tweets") / "in"
    generate(path, count=600, seed=11, partitions=2, bad_rate=0.02)
    return path


def test_the_tweet_topology_balances_with_no_spark_job_added(
    spark: Any,
    tmp_path: Path,
    tweets: Path,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The demo's bolts (parse, count, and the per-tweet ids) account for every record;
    the check is made from the jobs the txid runs anyway: the same jobs per txid with the
    ledger on and off, no recount, and the same counts in the sink."""
    recounted = recounts(monkeypatch)
    runs = {}
    for on in (True, False):
        prefix = f"{'on' if on else 'off'}:"

        def build(prefix: str = prefix) -> Any:
            committer = make_committer(
                "redis",
                CommitMode.TRANSACTIONAL,
                redis_url=redis_url,
                redis_key_prefix=prefix,
                record_ids=True,
            )
            return build_topology(FilesPartitionedSpout(tweets, 150), committer, record_ids=True)

        h = TopologyHarness(build, spark, topology_id=f"tweets-{on}", state_dir=tmp_path / prefix)
        runs[on] = h.run_until_drained(max_pending=1, ledger=on, warm_up=False).stats
    assert runs[True].failures == runs[False].failures == 0
    assert runs[True].records == runs[False].records == 600
    assert [t.jobs for t in runs[True].timings] == [t.jobs for t in runs[False].timings]
    assert recounted == []
    import redis

    client = redis.Redis.from_url(redis_url)
    for table in (HASHTAGS, USERS, USERS_HASHTAGS, "tweet_ids"):
        assert client.hgetall(f"on:{table}") == client.hgetall(f"off:{table}"), table
    assert client.lrange(f"on:{DEAD_LETTERS}", 0, -1) == client.lrange(f"off:{DEAD_LETTERS}", 0, -1)
    assert client.llen(f"on:{DEAD_LETTERS}") > 0
    assert (
        sum(int(v) for v in client.hgetall("on:tweet_ids").values())
        + client.llen(f"on:{DEAD_LETTERS}")
        == 600
    )


@pytest.mark.classic
def test_a_recount_that_balances_lets_the_txid_go_on(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A committer that keeps its input in a checkpoint hides it from the observation
    (read as zero): the ledger recounts, finds the bolt balanced, and the txid commits."""

    class Checkpointing(RowsCommitter):
        def collect_plan(
            self, attempt: TransactionAttempt, inputs: Mapping[str, DataFrame]
        ) -> Mapping[str, DataFrame]:
            return {n: f.localCheckpoint(eager=False) for n, f in inputs.items()}

    class Carry(Bolt):
        accounts = True

        def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
            return batch.withColumn("twice", F.col("id") * 2)

    sink = Checkpointing()
    with caplog.at_level(logging.WARNING, logger="transactional.ledger"):
        run = harness(spark, tmp_path, Carry(), sink).run_until_drained()
    assert run.stats.failures == 0
    assert sorted(r["twice"] for r in sink.rows["default"]) == [2 * n for n in range(TOTAL)]
    said = [r.getMessage() for r in caplog.records if "exact recount does" in r.getMessage()]
    assert len(said) == TOTAL // BATCH
    assert ID not in sink.columns


class WordSpout(RangeSpout):
    """Words, every seventh missing: ``None``."""

    def emit_batch(self, attempt: TransactionAttempt, meta: Any) -> DataFrame:
        word = F.when(F.col("id") % 7 == 0, F.lit(None)).otherwise(
            F.concat(F.lit("w"), (F.col("id") % 3).cast("string"))
        )
        return super().emit_batch(attempt, meta).select(word.alias("word"))


def test_the_docs_ledger_example_balances(spark: Any, tmp_path: Path) -> None:
    from tests.docs import example as docs_example

    example: dict[str, Any] = {"__name__": "docs_example"}
    exec(docs_example("docs/concepts/ledger.md").compiled(), example)
    sink = RowsCommitter()

    def build() -> Any:
        return (
            TopologyBuilder()
            .set_spout(WordSpout(TOTAL, BATCH))
            .set_bolt("count", example["CountWords"]())
            .set_committer("sink", sink, "count")
            .build()
        )

    run = TopologyHarness(build, spark, topology_id="words", state_dir=tmp_path).run_until_drained()
    assert run.stats.failures == 0
    got: Counter[str] = Counter()
    for r in sink.rows["default"]:
        got[r["word"]] += r["count"]
    assert got == Counter(f"w{n % 3}" for n in range(TOTAL) if n % 7 != 0)


def test_a_streams_tally_is_built_once_per_session_and_counts_each_frame_its_own(
    spark: Any,
) -> None:
    """The tally's aggregates are the same columns for every stream of the same columns
    (built once: ``columns.prebuilt``), and each stream's tally is still its own rows',
    computed here from the ids."""
    from functools import reduce
    from operator import xor

    from transactional.ledger import DROPPED, Tally
    from transactional.runtime.ledger_books import Tap

    first = spark.range(3).withColumn(ID, F.col("id") + 7)
    second = spark.range(5).withColumn(ID, F.col("id") * 11)
    columns = tuple(first.columns)
    a, b = Tap(first, columns, []), Tap(second, columns, [])
    assert a._metrics(columns) is b._metrics(columns)
    assert a._metrics((*columns, DROPPED)) is not a._metrics(columns)
    assert a.exact()[0] == Tally(3, reduce(xor, [7, 8, 9]))
    assert b.exact()[0] == Tally(5, reduce(xor, [0, 11, 22, 33, 44]))
