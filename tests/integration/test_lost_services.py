"""Services lost and restarted in the middle of a run (docs/design.md section 7, runner step
7): a ZooKeeper session that expires, a ZooKeeper server and a Redis server restarted,
and a commit whose reply is lost. Every run finishes, and the sink is checked exactly
against counts computed here in plain Python."""

from __future__ import annotations

import io
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis
from kazoo.client import KazooClient

from committers import CounterTable, RedisCommitter
from coordinators import SQLiteStateStore, ZooKeeperStateStore
from examples.tweets.cli import main as demo
from tests.history import assert_exact, read_redis
from tests.integration.topologies import BucketBolt, RangeSpout
from tests.processes import run_summary
from tests.reference import expected_counts
from tests.runner_logs import FailedTxids
from tests.witness import waited
from transactional import RunnerConfig, TopologyBuilder, TransactionalRunner
from transactional.committer import Committer, CommitterContext
from transactional.errors import CommitError, StoreUnavailableError
from transactional.store import StateStore
from transactional.testing.servers import RedisServer, ZooKeeperServer
from transactional.types import CommitOutcome, Guarantee, TransactionAttempt

pytestmark = pytest.mark.integration

TOPOLOGY = "lost"
SINK = f"transactional:{TOPOLOGY}:sink"


def expected_buckets(total: int) -> dict[str, int]:
    return dict(Counter(f"k{n % 7}" for n in range(total)))


def buckets(url: str) -> dict[str, int]:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return {k: int(v) for k, v in client.hgetall("buckets").items()}
    finally:
        client.close()


def run_buckets(
    spark: Any,
    store: StateStore,
    committer: Committer,
    total: int,
    batch: int,
    listener: Any = None,
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE,
) -> Any:
    topology = (
        TopologyBuilder()
        .set_spout(RangeSpout(total, batch))
        .set_bolt("bucket", BucketBolt())
        .set_committer("sink", committer, "bucket")
        .build()
    )
    # Commits in groups of up to three: the first after a start alone, then the next
    # txids together, each waiting for the ones after it still processing.
    config = RunnerConfig(
        topology_id=TOPOLOGY,
        max_pending=3,
        max_group=3,
        group_wait_s=30,
        backoff_initial_s=0.05,
        backoff_max_s=1.0,
        poll_interval_s=0.2,
        leader_timeout_s=90,
        guarantee=guarantee,
    )
    runner = TransactionalRunner(topology, store, spark, config, listener=listener)
    return runner.run(until_drained=True)


def redis_committer(url: str) -> RedisCommitter:
    return RedisCommitter(url, {"default": CounterTable("buckets", ("key",))})


class AtCommit:
    """The runner's listener: runs ``action`` once, on the runner's thread, right after
    ``txid`` committed, so the next store call meets whatever the action broke."""

    def __init__(self, txid: int, action: Callable[[], None]) -> None:
        self.txid, self.action, self.fired = txid, action, False
        #: at_most_once: the txids the run reported dropped (``on_drop``).
        self.dropped: list[int] = []

    def on_commit(self, txid: int, records: int) -> None:
        if txid == self.txid and not self.fired:
            self.fired = True
            self.action()

    def on_drop(self, txid: int, records: int | None) -> None:
        self.dropped.append(txid)


def expire_session(hosts: str, store: ZooKeeperStateStore) -> None:
    """Kazoo's trick: a second client joins the session and closes it; the server ends
    the session and deletes its ephemeral nodes (the leader node) at once."""
    session_id, password = store._client.client_id
    intruder = KazooClient(hosts=hosts, client_id=(session_id, password))
    intruder.start(timeout=15)
    intruder.stop()
    intruder.close()


def store_reports(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the ZooKeeper store said of its connection (its own warnings)."""
    return [r.getMessage() for r in caplog.records if r.name == "coordinators.zookeeper"]


def test_a_zookeeper_session_expiring_mid_run_is_taken_back_and_counts_exactly(
    spark: Any, redis_url: str, zk_hosts: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "coordinators.zookeeper")
    store = ZooKeeperStateStore(zk_hosts, session_timeout=4.0)
    before: list[int | None] = []

    before_session: list[int] = []

    def expire() -> None:
        before.append(store.fence_token())
        before_session.append(store._client.client_id[0])
        expire_session(zk_hosts, store)

    stats = run_buckets(spark, store, redis_committer(redis_url), 300, 50, AtCommit(2, expire))

    assert buckets(redis_url) == expected_buckets(300)
    assert stats.committed_txids == 6 and stats.last_committed == 6
    assert stats.reelections >= 1 and stats.grouped_commits >= 1
    client = redis.Redis.from_url(redis_url)
    # Commits after the loss carried the new leadership's (higher) token.
    assert before[0] is not None and int(client.get(f"{SINK}:fence") or 0) > before[0]
    assert int(client.get(f"{SINK}:txid") or 0) == 6
    # The store said so: the session it lost, named.
    expired = f"session=0x{before_session[0]:x}: this runner no longer leads"
    assert any(
        m.startswith("zookeeper session expired") and expired in m for m in store_reports(caplog)
    ), store_reports(caplog)


@pytest.mark.parametrize("guarantee", [Guarantee.AT_LEAST_ONCE, Guarantee.AT_MOST_ONCE])
def test_a_zookeeper_session_expiring_keeps_the_weaker_guarantees_promise(
    spark: Any, redis_url: str, zk_hosts: str, guarantee: Guarantee
) -> None:
    """The session ends right after txid 2's commit, with txids after it in flight:
    at_least_once replays them (nothing lost; its commits overlap, so one of them may
    have landed before the loss and count twice: whole batches, once each at most);
    at_most_once drops them, and the sink misses exactly the batches it reported."""
    store = ZooKeeperStateStore(zk_hosts, session_timeout=4.0)
    fences: list[int | None] = []

    def expire() -> None:
        fences.append(store.fence_token())
        expire_session(zk_hosts, store)

    listener = AtCommit(2, expire)
    stats = run_buckets(spark, store, redis_committer(redis_url), 300, 50, listener, guarantee)

    client = redis.Redis.from_url(redis_url)
    # The session did end: the commits after it carried the new leadership's token.
    assert fences[0] is not None and int(client.get(f"{SINK}:fence") or 0) > fences[0]
    dropped = set(listener.dropped)
    if guarantee is Guarantee.AT_LEAST_ONCE:
        assert not dropped
    assert stats.dropped_txids == len(dropped)
    kept = [n for n in range(300) if n // 50 + 1 not in dropped]  # txid t: [50(t-1), 50t)
    got = buckets(redis_url)
    if guarantee is Guarantee.AT_LEAST_ONCE:  # the txids in flight at the loss, again
        again = [
            [n for n in range(300) if n // 50 + 1 in txids]
            for k in range(4)
            for txids in itertools.combinations(range(3, 6), k)
        ]
        assert got in [dict(Counter(f"k{n % 7}" for n in kept + twice)) for twice in again]
    else:
        assert got == dict(Counter(f"k{n % 7}" for n in kept))
    assert stats.reelections >= 1


def test_the_status_is_not_waited_for_while_zookeeper_is_gone() -> None:
    """The status document is a report: with its ZooKeeper gone (a minority left, a
    server down) the store refuses it at once instead of holding the runner's thread
    until the connection comes back, which may be never."""
    server = ZooKeeperServer()
    server.start()
    store = ZooKeeperStateStore(server.hosts, session_timeout=4.0)
    try:
        store.open("status")
        store.acquire_leadership(10)
        store.publish_status({"n": 1})
        assert store.read_status() == {"n": 1}
        server.stop()  # SIGKILL: the client loses its connection
        waited(
            "the store's connection lost", lambda: store._client.state != "CONNECTED" or None, 30
        )
        outcome: list[BaseException | None] = []

        def publish() -> None:
            try:
                store.publish_status({"n": 2})
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        thread.join(30)  # a deadline: without the refusal it waits for ever
        assert not thread.is_alive(), "publish_status waited for ZooKeeper to come back"
        assert isinstance(outcome[0], StoreUnavailableError), outcome
    finally:
        server.close()
        store.close()


def test_a_zookeeper_restart_mid_run_is_ridden_out_and_counts_exactly(
    spark: Any, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "coordinators.zookeeper")
    server = ZooKeeperServer()
    server.start()
    restart: list[threading.Thread] = []

    def stop_then_start() -> None:
        server.stop()  # SIGKILL: the data directory (and the session) survive
        thread = threading.Thread(target=lambda: (time.sleep(1.0), server.start()))
        thread.start()
        restart.append(thread)

    try:
        store = ZooKeeperStateStore(server.hosts, session_timeout=10.0)
        stats = run_buckets(
            spark, store, redis_committer(redis_url), 300, 50, AtCommit(2, stop_then_start)
        )
    finally:
        for thread in restart:
            thread.join(90)
        server.close()

    assert restart, "the server was never restarted"
    # The store said so: the connection lost with the server, and back once it returned.
    said = [m.split(" topology=")[0] for m in store_reports(caplog)]
    assert "zookeeper connection lost" in said and "zookeeper connection back" in said, said
    assert said.index("zookeeper connection lost") < said.index("zookeeper connection back")
    assert buckets(redis_url) == expected_buckets(300)
    assert stats.committed_txids == 6 and stats.last_committed == 6
    assert stats.reelections >= 1 and stats.grouped_commits >= 1


@pytest.fixture
def tweets(tmp_path: Path) -> Path:
    out = tmp_path / "tweets"
    code = demo(
        [
            "generate",
            "--count",
            "240",
            "--seed",
            "5",
            "--partitions",
            "2",
            "--bad-rate",
            "0.05",
            "--out",
            str(out),
        ],
        out=io.StringIO(),
    )
    assert code == 0
    return out


@pytest.fixture
def aof_redis() -> Iterator[RedisServer]:
    """A Redis of its own, durable as a production sink would be: every write fsynced
    to the append-only file before it is acknowledged, so a restart keeps it."""
    server = RedisServer(appendonly=True)
    server.start()
    yield server
    server.close()


def test_a_redis_restart_mid_run_hits_source_and_sink_and_counts_exactly(
    spark: Any, aof_redis: RedisServer, tweets: Path, tmp_path: Path
) -> None:
    url = aof_redis.url
    assert demo(["load", "--input", str(tweets), "--redis-url", url], out=io.StringIO()) == 0
    restarted_at: list[int] = []
    errors: list[BaseException] = []
    failures = FailedTxids()
    runner_log = logging.getLogger("transactional.runner")
    runner_log.addHandler(failures)

    def restart_after_the_first_commit() -> None:
        try:
            client = redis.Redis.from_url(url)
            deadline = time.monotonic() + 240
            while (held := int(client.get("transactional:tweets:sink:txid") or 0)) < 1:
                assert time.monotonic() < deadline, "txid 1 was never committed"
                time.sleep(0.02)
            client.close()
            aof_redis.stop()  # SIGKILL
            # Down until the runner has failed on it (a source read or a commit): the
            # fault acts on every run, whatever the timing.
            assert failures.seen.wait(120), "nothing failed while Redis was down"
            aof_redis.start()
            restarted_at.append(held)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    watcher = threading.Thread(target=restart_after_the_first_commit)
    watcher.start()
    out = io.StringIO()
    code = demo(
        [
            "run",
            "--source",
            "redis",
            "--redis-url",
            url,
            "--spout",
            "transactional",
            "--sink",
            "redis",
            "--batch-size",
            "60",
            "--max-pending",
            "3",
            "--max-group",  # 1 alone, then 2..4 as one group
            "3",
            "--group-wait",
            "30",
            "--state-dir",
            str(tmp_path / "state"),
            "--until-drained",
            "--master",
            "local[2]",
            "--top",
            "0",
        ],
        out=out,
    )
    watcher.join(60)
    runner_log.removeHandler(failures)
    assert not errors, errors
    assert code == 0, out.getvalue()
    # It failed on the stopped Redis, retried, and recovered.
    assert any("Connection" in message for message in failures.messages), failures.messages
    assert run_summary(out.getvalue())["failures"] >= 1
    client = redis.Redis.from_url(url, decode_responses=True)
    final = int(client.get("transactional:tweets:sink:txid") or 0)
    assert restarted_at and restarted_at[0] < final == 4  # restarted mid-run
    assert_exact(read_redis(url, inputs="tweets:*"), expected_counts(tweets), ids=False)


class LostReply(Committer):
    """The real Redis committer, except that the first commit of ``txid`` raises a
    timeout as if the reply had been lost: after the script ran (``applied``) or
    before it was sent."""

    def __init__(self, inner: RedisCommitter, txid: int, applied: bool) -> None:
        self.inner, self.txid, self.applied = inner, txid, applied
        self.calls: list[int] = []

    def open(self, context: CommitterContext) -> None:
        self.inner.open(context)

    def close(self) -> None:
        self.inner.close()

    def prepare(self, attempt: TransactionAttempt, inputs: Mapping[str, Any]) -> Any:
        return self.inner.prepare(attempt, inputs)

    def commit(self, attempt: TransactionAttempt, prepared: Any) -> CommitOutcome:
        self.calls.append(attempt.txid)
        if attempt.txid == self.txid and self.calls.count(self.txid) == 1:
            if self.applied:
                self.inner.commit(attempt, prepared)
            raise CommitError(
                f"Redis commit of txid {attempt.txid} failed: TimeoutError"
            ) from redis.exceptions.TimeoutError("Timeout reading from socket")
        return self.inner.commit(attempt, prepared)

    def committed_txid(self) -> int | None:
        return self.inner.committed_txid()


@pytest.mark.parametrize("applied", [True, False], ids=["after-the-script", "before-it"])
def test_a_commit_whose_reply_is_lost_is_resolved_by_the_sinks_txid(
    spark: Any, redis_url: str, tmp_path: Path, applied: bool
) -> None:
    committer = LostReply(redis_committer(redis_url), txid=2, applied=applied)
    store = SQLiteStateStore(tmp_path / "state.db")
    stats = run_buckets(spark, store, committer, 300, 100)

    assert buckets(redis_url) == expected_buckets(300)
    assert stats.committed_txids == 3
    if applied:  # the sink holds txid 2: advanced on that, never committed again
        assert committer.calls == [1, 2, 3]
        assert (stats.resolved_commits, stats.failures) == (1, 0)
    else:  # the sink does not hold it: replayed as any failed commit
        assert committer.calls == [1, 2, 2, 3]
        assert (stats.resolved_commits, stats.failures) == (0, 1)
