"""Fencing a deposed leader in the sink (docs/design.md section 7): a leader that passed its
leadership check and was then frozen must not write once its successor has. The Redis
script compares the runner's fence token with the highest one that committed."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
from deltalake import DeltaTable

from committers import CounterTable, DeltaCommitter, RedisCommitter
from committers.delta._snapshot import ATTEMPT_SLOTS
from committers.redis._batch import RedisBatch
from coordinators import ZooKeeperStateStore
from tests.integration.test_lost_services import (
    TOPOLOGY,
    buckets,
    expected_buckets,
    expire_session,
    redis_committer,
)
from tests.integration.topologies import BucketBolt, RangeSpout
from transactional import RunnerConfig, TopologyBuilder, TransactionalRunner
from transactional.committer import CommitterContext
from transactional.errors import FencedError, LostLeadershipError
from transactional.faults import FaultPoint
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

pytestmark = pytest.mark.integration


def committer(url: str, token: int, mode: CommitMode = CommitMode.TRANSACTIONAL) -> RedisCommitter:
    sink = RedisCommitter(url, {"in": CounterTable("c", ("k",))}, mode=mode, namespace="ns")
    sink.open(CommitterContext(None, "t", "sink", fence_token=token))
    return sink


def commit(sink: RedisCommitter, txid: int, value: int) -> CommitOutcome:
    batch = RedisBatch.of(txid, {"c": {"a": value}})
    return sink.commit(TransactionAttempt(txid, 1), batch)


@pytest.mark.parametrize("mode", list(CommitMode))
def test_redis_refuses_a_lower_fence_token_and_writes_nothing(
    redis_url: str, mode: CommitMode
) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    old, new = committer(redis_url, 5, mode), committer(redis_url, 7, mode)
    try:
        # Before the new leader writes anything the old one still gets through: it led
        # when it wrote, and the new leader replays from the store's currtx anyway.
        assert commit(old, 1, 1) == CommitOutcome.APPLIED
        # The new leader's replay of txid 1 (a skip in transactional mode, a rewrite in
        # opaque mode) raises the fence.
        replay = (
            CommitOutcome.SKIPPED if mode is CommitMode.TRANSACTIONAL else CommitOutcome.REAPPLIED
        )
        assert commit(new, 1, 1) == replay
        assert client.get("ns:fence") == "7"
        # The old leader wakes up: neither the next txid nor a rewrite of txid 1 (the
        # opaque undo that would wipe its successor's write) gets through.
        for txid, value in ((2, 100), (1, 100)):
            with pytest.raises(FencedError, match="it holds fence token 7, this runner's is 5"):
                commit(old, txid, value)
        assert client.hgetall("c") == {"a": "1"}
        assert (client.get("ns:txid"), client.get("ns:fence")) == ("1", "7")
        assert commit(new, 2, 2) == CommitOutcome.APPLIED
        assert client.hgetall("c") == {"a": "3"}
    finally:
        old.close()
        new.close()
        client.close()


class FreezeAt:
    """A fault plan that freezes the commit thread at ``point`` of ``txid`` until
    released: the runner has checked its leadership and is about to write, as a
    process stopped with SIGSTOP at that instant would be."""

    def __init__(self, point: FaultPoint, txid: int) -> None:
        self.point, self.txid = point, txid
        self.reached, self.release = threading.Event(), threading.Event()

    def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        if point is self.point and attempt.txid == self.txid and not self.reached.is_set():
            self.reached.set()
            assert self.release.wait(180), "the test never released the frozen commit"


def runner(
    spark: Any,
    url: str,
    store: ZooKeeperStateStore,
    faults: Any = None,
    sink: Any = None,
    leader_timeout_s: float = 60,
    grouped: bool = False,
) -> Any:
    """Txids of 60 of 300 numbers into ``sink`` (default: Redis at ``url``); with
    ``grouped``, txid 1 alone and then 2..4 as one commit group."""
    topology = (
        TopologyBuilder()
        .set_spout(RangeSpout(300, 60))
        .set_bolt("bucket", BucketBolt())
        .set_committer("sink", sink or redis_committer(url), "bucket")
        .build()
    )
    # One txid in flight and no timeout: while its commit is frozen the runner has
    # nothing else to do, and touches neither the store nor the sink.
    # (Grouped: three in flight, all three in the frozen commit.)
    config = RunnerConfig(
        topology_id=TOPOLOGY,
        max_pending=3 if grouped else 1,
        max_group=3,
        group_wait_s=60 if grouped else 0,
        attempt_timeout_s=None,
        leader_timeout_s=leader_timeout_s,
    )
    return TransactionalRunner(topology, store, spark, config, faults=faults)


@pytest.mark.parametrize("grouped", [False, True], ids=["one-txid", "group-2-4"])
def test_a_leader_frozen_after_its_check_cannot_commit_after_its_successor(
    spark: Any, redis_url: str, zk_hosts: str, caplog: pytest.LogCaptureFixture, grouped: bool
) -> None:
    # Frozen committing txid 3: alone, or in the group 2..4.
    freeze = FreezeAt(FaultPoint.BEFORE_SINK_WRITE, txid=3)
    old_store = ZooKeeperStateStore(zk_hosts, session_timeout=4.0)
    old = runner(spark, redis_url, old_store, freeze, grouped=grouped)
    outcome: dict[str, BaseException] = {}

    def run_old() -> None:
        try:
            old.run(until_drained=True)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run_old)
    thread.start()
    try:
        assert freeze.reached.wait(180), "the old leader never reached its commit of txid 3"
        old_token = old_store.fence_token()
        expire_session(zk_hosts, old_store)  # its session ends while it is frozen

        new_store = ZooKeeperStateStore(zk_hosts, session_timeout=4.0)
        stats = runner(spark, redis_url, new_store, grouped=grouped).run(until_drained=True)
        # It replayed the frozen commit: txids 3, 4 and 5, or the group 2..4 and 5.
        assert stats.committed_txids == (4 if grouped else 3)
        assert stats.grouped_commits == (1 if grouped else 0)
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        new_fence = int(client.get("transactional:lost:sink:fence") or 0)
        assert old_token is not None and new_fence > old_token
    finally:
        with caplog.at_level(logging.WARNING, logger="transactional.runner"):
            freeze.release.set()  # the old leader wakes up in the middle of its commit
            thread.join(120)

    assert isinstance(outcome.get("error"), FencedError), outcome
    assert "deposed" in caplog.text and "it holds fence token" in caplog.text
    assert old.stats.committed_txids == (1 if grouped else 2) and old.stats.reelections == 0
    # Nothing of the old leader's late commit reached the sink.
    assert buckets(redis_url) == expected_buckets(300)
    assert client.get("transactional:lost:sink:txid") == "5"
    assert int(client.get("transactional:lost:sink:fence") or 0) == new_fence


def delta_buckets(spark: Any, path: Path) -> dict[str, int]:
    rows = spark.read.format("delta").load(str(path / "buckets")).collect()
    return {row["key"]: row["count"] for row in rows}


def test_a_deposed_leader_frozen_before_its_delta_write_writes_nothing(
    spark: Any, zk_hosts: str, tmp_path: Path
) -> None:
    """Opaque mode, where a late write would do harm: the old leader is frozen before
    its write of txid 3 and deposed; its successor rewrites txid 3 and is held right
    after that write, still on txid 3. Now the old leader wakes: it finds it no longer
    leads (the committer checks right before each table's write) and writes nothing.
    A leader deposed after that check, its write under way, is refused by the table's
    fence token or Delta's conflict check: ``test_delta_committer.py``'s
    ``test_a_deposed_leader_never_applies_a_txid_twice``."""
    delta = tmp_path / "delta"
    table = str(delta / "buckets")
    APP = f"{TOPOLOGY}:sink:buckets:opaque"

    def sink() -> DeltaCommitter:
        counters = {"default": CounterTable("buckets", ("key",))}
        return DeltaCommitter(str(delta), counters, mode=CommitMode.OPAQUE)

    def run(target: TransactionalRunner, into: dict[str, Any]) -> threading.Thread:
        def body() -> None:
            try:
                into["stats"] = target.run(until_drained=True)
            except BaseException as exc:
                into["error"] = exc

        thread = threading.Thread(target=body)
        thread.start()
        return thread

    freeze = FreezeAt(FaultPoint.BEFORE_SINK_WRITE, txid=3)
    old_store = ZooKeeperStateStore(zk_hosts, session_timeout=4.0)
    old = runner(spark, "", old_store, freeze, sink=sink(), leader_timeout_s=2)
    hold = FreezeAt(FaultPoint.AFTER_SINK_WRITE, txid=3)
    new = runner(spark, "", ZooKeeperStateStore(zk_hosts, session_timeout=4.0), hold, sink())
    old_outcome: dict[str, Any] = {}
    new_outcome: dict[str, Any] = {}
    old_thread = run(old, old_outcome)
    new_thread = None
    try:
        assert freeze.reached.wait(180), "the old leader never reached its commit of txid 3"
        expire_session(zk_hosts, old_store)  # its session ends while it is frozen
        new_thread = run(new, new_outcome)
        assert hold.reached.wait(180), "the successor never wrote txid 3"
        rewritten = DeltaTable(table).version()
        # The successor's write of txid 3 (the old leader's never began).
        assert DeltaTable(table).transaction_version(APP) == 3 * ATTEMPT_SLOTS
        freeze.release.set()  # the old leader wakes up in the middle of its commit
        old_thread.join(120)
        assert DeltaTable(table).version() == rewritten  # it wrote nothing
    finally:
        freeze.release.set()
        hold.release.set()
        old_thread.join(120)
        if new_thread is not None:
            new_thread.join(180)

    # It found it no longer led and could not lead again while its successor did.
    assert isinstance(old_outcome.get("error"), LostLeadershipError), old_outcome
    assert old.stats.committed_txids == 2
    assert "error" not in new_outcome, new_outcome
    assert new_outcome["stats"].committed_txids == 3  # txids 3, 4 and 5
    assert delta_buckets(spark, delta) == expected_buckets(300)
    assert DeltaTable(table).transaction_version(APP) == 5 * ATTEMPT_SLOTS
