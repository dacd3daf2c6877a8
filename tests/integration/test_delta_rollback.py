"""Rolling a Delta committer back (real Delta, ``DeltaCommitter.rollback``): to a txid
committed alone, to the end of a commit group, to before the first txid, in both modes;
each table then holds what the txids up to there made (sums computed here) and the
txid's marker, so the txids after it commit again instead of being skipped; a txid
inside a group, or one no table reached, is refused with nothing written."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from committers import Count, DeltaCommitter
from transactional.committer import CommitterContext
from transactional.errors import ConfigurationError
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

pytestmark = pytest.mark.integration

#: The keys each txid counts; txids 2 and 3 are committed as one group.
BATCHES = {1: ["a", "b"], 2: ["a"], 3: ["c", "a"], 4: ["b", "d"]}


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the tables are: a local directory, or a bucket of the S3 stand-in."""
    if request.param == "local":
        return str(tmp_path)
    return f"s3://{request.getfixturevalue('s3_bucket')}/delta"


def committer(spark: Any, path: Path | str, mode: CommitMode) -> DeltaCommitter:
    sink = DeltaCommitter(str(path), {"in": Count("seen", "k")}, dead_letters="bad", mode=mode)
    sink.open(CommitterContext(spark, "topo", "sink"))
    return sink


def prepared(spark: Any, sink: DeltaCommitter, txid: int) -> Any:
    keys = spark.createDataFrame([(k,) for k in BATCHES[txid]], "k string")
    dead = spark.createDataFrame([(f"bad {txid}", "why")], "raw string, reason string")
    return sink.prepare(TransactionAttempt(txid, 1), {"in": keys, "bad": dead})


def commit_all(spark: Any, sink: DeltaCommitter, txids: list[int]) -> list[CommitOutcome]:
    outcomes = []
    for txid in txids:
        if txid == 2:
            continue
        if txid == 3:
            attempts = [TransactionAttempt(2, 1), TransactionAttempt(3, 1)]
            parts = [prepared(spark, sink, 2), prepared(spark, sink, 3)]
            outcomes.append(sink.commit_group(attempts, parts))
        else:
            outcomes.append(sink.commit(TransactionAttempt(txid, 1), prepared(spark, sink, txid)))
    return outcomes


def held(spark: Any, sink: DeltaCommitter) -> tuple[dict[str, int], list[str]]:
    counts = spark.read.format("delta").load(sink.location("seen")).collect()
    dead = spark.read.format("delta").load(sink.location("dead_letters")).collect()
    return {r["k"]: r["count"] for r in counts}, sorted(r["raw"] for r in dead)


def made_by(txids: range) -> tuple[dict[str, int], list[str]]:
    counts = Counter(k for t in txids for k in BATCHES[t])
    return dict(counts), sorted(f"bad {t}" for t in txids)


@pytest.mark.parametrize("mode", list(CommitMode))
@pytest.mark.rotated
def test_a_rollback_restores_every_table_and_its_marker(
    spark: Any, root: str, mode: CommitMode
) -> None:
    sink = committer(spark, root, mode)
    applied = CommitOutcome.APPLIED
    assert commit_all(spark, sink, [1, 2, 3, 4]) == [applied] * 3
    assert held(spark, sink) == made_by(range(1, 5))

    with pytest.raises(
        ConfigurationError, match=r"no version of it holds that txid \(its log holds txids 1, 3..4"
    ):
        sink.rollback("topo", "sink", 2)  # inside the group 2..3
    with pytest.raises(ConfigurationError, match="holds txid 4 of 'topo:sink:seen"):
        sink.rollback("topo", "sink", 5)
    assert held(spark, sink) == made_by(range(1, 5))  # refusals wrote nothing

    plan = sink.rollback("topo", "sink", 3)
    # Versions: 0 created, 1 txid 1, 2 the group 2..3, 3 txid 4.
    assert [s.rsplit("/", 1)[-1] for s in plan.steps] == [
        "seen: restore version 2 (txid 3)",
        "dead_letters: restore version 2 (txid 3)",
    ]
    plan.apply()
    plan.apply()  # again, as after a crash: nothing more happens
    assert held(spark, sink) == made_by(range(1, 4))
    assert sink.committed_txid() == 3
    # txid 4 commits again (it is not skipped: the marker went back too).
    assert commit_all(spark, sink, [4]) == [applied]
    assert held(spark, sink) == made_by(range(1, 5))

    sink.rollback("topo", "sink", 0).apply()
    assert held(spark, sink) == ({}, [])
    assert commit_all(spark, sink, [1, 2, 3, 4]) == [applied] * 3
    assert held(spark, sink) == made_by(range(1, 5))
