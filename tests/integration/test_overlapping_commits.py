"""Overlapping commits under ``at_least_once`` on a real Redis (``Committer.
overlapping_commits``): several commits run at once, seen by the committer's own clock
(test code), a later txid landing first, and the sink ends exact; the commit
script keeps the sink's txid at the end of the unbroken run of txids it holds, whatever
order the commits land in; a committer whose commits do not commute keeps them one at a
time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from committers import CounterTable, RedisCommitter
from committers.redis._batch import RedisBatch
from tests.integration.topologies import TOTAL, BucketBolt, RangeSpout, expected_counts
from tests.processes import store_state, stored_metas
from transactional import Bolt, TopologyBuilder
from transactional.committer import CommitterContext
from transactional.faults import FaultPoint
from transactional.testing import FaultPlan, SimulatedCrash, TopologyHarness
from transactional.topology import Topology
from transactional.types import CommitMode, CommitOutcome, Guarantee, TransactionAttempt

pytestmark = [pytest.mark.integration, pytest.mark.connect]


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url, decode_responses=True)
    conn.flushdb()
    yield conn
    conn.close()


def at_least_once(url: str, settled: int, table: CounterTable | None = None) -> RedisCommitter:
    sink = RedisCommitter(url, {"in": table or CounterTable("h", ("k",))}, namespace="ns")
    context = CommitterContext(
        None, "t", "sink", 1, guarantee=Guarantee.AT_LEAST_ONCE, settled=lambda: settled
    )
    sink.open(context)
    return sink


def test_the_sinks_txid_ends_the_unbroken_run_whatever_order_commits_land_in(
    redis_url: str, client: redis.Redis
) -> None:
    sink = at_least_once(redis_url, settled=1)
    assert sink.overlapping_commits()

    def commit(txid: int, n: int) -> None:
        batch = RedisBatch.of(txid, {"h": {"a": n}})
        assert sink.commit(TransactionAttempt(txid, 1), batch) is CommitOutcome.APPLIED

    commit(2, 20)  # lands before txid 1: applied, the txid stays where it was
    assert (client.get("ns:txid"), client.hget("h", "a")) == (None, "20")
    commit(4, 400)
    assert client.get("ns:txid") is None and sink.committed_txid() is None
    commit(1, 1)  # the run reaches 2, not 4
    assert (client.get("ns:txid"), client.hget("h", "a")) == ("2", "421")
    commit(3, 3000)  # and now 4
    assert (client.get("ns:txid"), client.hget("h", "a")) == ("4", "3421")
    assert client.zrange("ns:ahead", 0, -1) == []
    commit(3, 3000)  # a replay of a txid held: applied again, the txid does not move
    assert (client.get("ns:txid"), client.hget("h", "a")) == ("4", "6421")
    sink.close()


def test_a_store_that_moved_past_txids_the_sink_never_saw_starts_the_run_there(
    redis_url: str, client: redis.Redis
) -> None:
    sink = at_least_once(redis_url, settled=50)  # a new namespace for a topology at 50
    assert sink.commit(TransactionAttempt(51, 1), RedisBatch.of(51, {"h": {"a": 5}}))
    assert client.get("ns:txid") == "49"  # what the store moved past is held: settled
    assert sink.commit(TransactionAttempt(50, 1), RedisBatch.of(50, {"h": {"a": 5}}))
    assert client.get("ns:txid") == "51"
    sink.close()


@pytest.mark.parametrize(
    ("aggregate", "value_type", "order_by", "overlaps"),
    [
        ("sum", "long", None, True),
        ("sum", "decimal(12,2)", None, True),
        ("max", "long", None, True),
        ("sum", "double", None, False),  # rounding depends on the order of the additions
        ("last", "long", "t", False),  # the later txid's value must win
    ],
)
def test_only_commits_that_commute_overlap(
    redis_url: str, aggregate: str, value_type: str, order_by: str | None, overlaps: bool
) -> None:
    table = CounterTable(
        "h", ("k",), value="v", aggregate=aggregate, value_type=value_type, order_by=order_by
    )
    sink = RedisCommitter(redis_url, {"in": table}, namespace="ns")
    assert sink.overlapping_commits() is overlaps
    opaque = RedisCommitter(redis_url, {"in": table}, namespace="ns", mode=CommitMode.OPAQUE)
    assert not opaque.overlapping_commits()  # an opaque replay undoes the txid's last write


class Recorded(RedisCommitter):
    """A Redis committer that records when each commit began and ended (test code, not
    the runner's word); under ``hold``, txid 1's commit waits until txid 2's ended (or a
    deadline passes), so that txid 2 lands first."""

    began: dict[int, float]
    ended: dict[int, float]
    second: threading.Event
    hold: bool
    #: While set, txid 1 "dies" (``SimulatedCrash``) right before its write, once txid
    #: 2's landed; it is cleared then (the next run goes through).
    crash_first = threading.Event()

    def commit(self, attempt: TransactionAttempt, prepared: Any) -> CommitOutcome:
        self.began[attempt.txid] = time.monotonic()
        if attempt.txid == 1 and self.hold:
            assert self.second.wait(120), "txid 2 was not committed while txid 1 waited"
            if self.crash_first.is_set():
                self.crash_first.clear()
                raise SimulatedCrash(FaultPoint.BEFORE_SINK_WRITE, 1, 1)
        try:
            return super().commit(attempt, prepared)
        finally:
            self.ended[attempt.txid] = time.monotonic()
            if attempt.txid == 2:
                self.second.set()


@pytest.mark.parametrize("guarantee", [Guarantee.AT_LEAST_ONCE, Guarantee.EXACTLY_ONCE])
def test_commits_overlap_under_at_least_once_only_and_count_every_record_once(
    spark: Any, redis_url: str, client: redis.Redis, tmp_path: Path, guarantee: Guarantee
) -> None:
    overlap = guarantee is Guarantee.AT_LEAST_ONCE
    began: dict[int, float] = {}
    ended: dict[int, float] = {}
    second = threading.Event()

    def topology() -> Topology:
        sink = Recorded(redis_url, {"default": CounterTable("buckets", ("key",))}, namespace="ov")
        sink.began, sink.ended, sink.second, sink.hold = began, ended, second, overlap
        return (
            TopologyBuilder()
            .set_spout(RangeSpout(batch=TOTAL // 10))
            .set_bolt("bucket", BucketBolt())
            .set_committer("sink", sink, "bucket")
            .build()
        )

    harness = TopologyHarness(
        topology,
        spark,
        topology_id=f"overlap-{guarantee.value}",
        state_dir=tmp_path / "state",
        guarantee=guarantee,
    )
    run = harness.run_until_drained(max_pending=4, max_group=1)
    assert run.stats.committed_txids == 10
    assert client.hgetall("buckets") == {k: str(v) for k, v in expected_counts().items()}
    assert (client.get("ov:txid"), client.zcard("ov:ahead")) == ("10", 0)
    # Under at_least_once the commits overlapped and txid 2 landed first (the runner
    # may even have called txid 2's commit before txid 1's: the two run side by side).
    # Under exactly_once, each began after the one before ended.
    ordered = all(ended[t] <= began[t + 1] for t in range(1, 10))
    assert ordered is not overlap, (began, ended)
    if overlap:
        assert ended[2] < ended[1], (began, ended)


class ById(Bolt):
    """Counts each number of the range by itself: the sink says which records it holds,
    and how many times."""

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        keys = batch.select(F.col("id").cast("string").alias("key"))
        return keys.groupBy("key").agg(F.count("*").alias("count"))


#: Every step of the protocol a one-committer topology has, at txid 3, with commits
#: running as they come; and (None) txid 1 dying before its write once txid 2's landed,
#: so that the sink holds txids with a gap before them.
STEPS = [None, *(p for p in FaultPoint if p is not FaultPoint.BETWEEN_COMMITTERS)]


@pytest.mark.parametrize(
    ("point", "txid"), [(p, 1 if p is None else 3) for p in STEPS], ids=lambda p: str(p)
)
def test_a_crash_among_overlapping_commits_loses_nothing_and_applies_again_what_the_sink_held(
    spark: Any,
    redis_url: str,
    client: redis.Redis,
    tmp_path: Path,
    point: FaultPoint | None,
    txid: int,
) -> None:
    began: dict[int, float] = {}
    second, crash_first = threading.Event(), threading.Event()
    batch = TOTAL // 10

    def topology() -> Topology:
        sink = Recorded(redis_url, {"default": CounterTable("ids", ("key",))}, namespace="ov")
        sink.began, sink.ended, sink.second, sink.hold = began, {}, second, point is None
        sink.crash_first = crash_first
        return (
            TopologyBuilder()
            .set_spout(RangeSpout(batch=batch))
            .set_bolt("by_id", ById())
            .set_committer("sink", sink, "by_id")
            .build()
        )

    state = tmp_path / "state"
    harness = TopologyHarness(
        topology, spark, topology_id="overlap", state_dir=state, guarantee=Guarantee.AT_LEAST_ONCE
    )
    if point is None:
        crash_first.set()
        harness.run_until_drained(max_pending=4, max_group=1)
        assert not crash_first.is_set()  # it fired
    else:
        plan = FaultPlan().crash(point, txid)
        assert harness.run_until_drained(plan, max_pending=4, max_group=1).crashed
    # What the crash left, read from Redis and from the store's file, not from the runner:
    # every record the sink held of a txid the store had not moved past is applied again.
    held = {int(k) for k in client.hkeys("ids")}
    currtx, _ = store_state(state, "overlap")
    metas = stored_metas(state, "overlap")
    replayed = {t for t in metas if t >= currtx}
    again = {n for t in replayed for n in range(metas[t]["start"], metas[t]["start"] + batch)}
    if point is None:  # the sink holds txids with a gap before them
        assert batch in held and 0 not in held and currtx == 1

    harness.run_until_drained(max_pending=4, max_group=1)
    got = {int(k): int(v) for k, v in client.hgetall("ids").items()}
    assert got == {n: 1 + (n in held and n in again) for n in range(TOTAL)}
    assert (client.get("ov:txid"), client.zcard("ov:ahead")) == ("10", 0)
