"""The Redis committer on a Redis Cluster (three masters, one replica each, on loopback,
every node with ``appendfsync always``): a layout whose keys span hash slots is refused
at ``open`` with nothing written; a commit is not reported done until its replica holds
it (``WAIT``); a commit reported done survives the SIGKILL of its master and the
failover; and the demo, its master SIGKILLed mid-run and restarted, counts exactly
(answers from the input files, ``tests.reference``)."""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.cluster

from committers import CounterTable, RedisCommitter
from committers.redis._batch import RedisBatch
from tests.history import judge, read_redis
from tests.processes import DemoProcess, generated_tweets, redis_txid
from tests.reference import Expected
from tests.witness import replicas_of, wait_promoted
from transactional.committer import CommitterContext
from transactional.errors import CommitError, ConfigurationError
from transactional.testing.cluster_servers import ClusterNode, RedisCluster
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

pytestmark = pytest.mark.cluster

TABLE = CounterTable("words", ("word",))
PREFIX = "{app}:"


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    servers = RedisCluster(masters=3, replicas=1, node_timeout_ms=2000)
    servers.start()
    yield servers
    servers.close()


@pytest.fixture
def client(cluster: RedisCluster) -> Iterator[redis.cluster.RedisCluster]:
    """redis-py's own cluster client (not the committer's code), every master flushed."""
    cluster.wait_ok()
    conn = redis.cluster.RedisCluster.from_url(cluster.url, decode_responses=True)
    conn.flushall(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
    yield conn
    conn.close()


def opened(url: str, topology: str, **options: object) -> RedisCommitter:
    sink = RedisCommitter(url, {"in": TABLE}, dead_letters="bad", **options)  # type: ignore[arg-type]
    sink.open(CommitterContext(None, topology, "sink", fence_token=1))
    return sink


def batch(txid: int, counts: dict[str, int], dead: int = 0) -> RedisBatch:
    letters = [f'{{"raw": "x{txid}.{i}", "reason": "r", "txid": {txid}}}' for i in range(dead)]
    return RedisBatch.of(txid, {"words": counts}, letters)


def stored(client: redis.cluster.RedisCluster, topology: str) -> tuple[dict[str, int], int, int]:
    """The hash, the dead letters' count and the txid marker, read by redis-py."""
    counts = {k: int(v) for k, v in client.hgetall(f"{PREFIX}words").items()}
    marker = client.get(f"{PREFIX}transactional:{topology}:sink:txid")
    return counts, int(client.llen(f"{PREFIX}dead_letters")), int(marker or 0)


@pytest.mark.parametrize(
    "options",
    [{}, {"key_prefix": PREFIX, "namespace": "plain:namespace"}],
    ids=["no hash tag", "namespace without the tag"],
)
def test_keys_in_several_slots_are_refused_at_open_and_nothing_is_written(
    cluster: RedisCluster, client: redis.cluster.RedisCluster, options: dict[str, str]
) -> None:
    sink = RedisCommitter(cluster.url, {"in": TABLE}, dead_letters="bad", **options)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError) as refused:
        sink.open(CommitterContext(None, "t", "sink", fence_token=1))
    message = str(refused.value)
    assert "committer 'sink'" in message and "must all be in one hash slot" in message
    assert "key_prefix='{myapp}:'" in message
    # Every key is named with its slot, as the server computes it (CLUSTER KEYSLOT).
    words = f"{options.get('key_prefix', '')}words"
    txid = f"{options.get('namespace', 'transactional:t:sink')}:txid"
    for what, key in (("hash of 'words'", words), ("txid key", txid)):
        assert f"{what} {key!r} in slot {client.cluster_keyslot(key)}" in message
    assert not list(client.scan_iter(target_nodes=redis.cluster.RedisCluster.PRIMARIES))


def test_a_commit_is_done_only_when_its_replica_holds_it(
    cluster: RedisCluster, client: redis.cluster.RedisCluster
) -> None:
    sink = opened(cluster.url, "wait", key_prefix=PREFIX, wait_timeout_s=1.0)
    replica = _replica_of(cluster, cluster.master_of(f"{PREFIX}words"))
    try:
        assert sink.commit(TransactionAttempt(1, 1), batch(1, {"a": 1, "b": 2}, dead=1)) is (
            CommitOutcome.APPLIED
        )
        assert replica.proc is not None
        os.kill(replica.proc.pid, signal.SIGSTOP)  # the replica acknowledges nothing
        try:
            with pytest.raises(CommitError, match=r"0 of the 1 replica\(s\) it waits for"):
                sink.commit(TransactionAttempt(2, 1), batch(2, {"a": 10, "c": 5}, dead=2))
            # Nor does the sink say it holds txid 2 (the runner asks when a commit's
            # outcome is unknown, and would not commit it again).
            with pytest.raises(CommitError, match="holds txid 2, but 0 of the 1 replica"):
                sink.committed_txid()
        finally:
            os.kill(replica.proc.pid, signal.SIGCONT)
        # The master holds txid 2: the retry skips it, and waits for the replica again.
        assert sink.commit(TransactionAttempt(2, 2), batch(2, {"a": 10, "c": 5}, dead=2)) is (
            CommitOutcome.SKIPPED
        )
        assert stored(client, "wait") == ({"a": 11, "b": 2, "c": 5}, 3, 2)
        assert sink.committed_txid() == 2
    finally:
        sink.close()


@pytest.mark.parametrize("mode", list(CommitMode))
def test_a_commit_reported_done_survives_the_sigkill_of_its_master(
    cluster: RedisCluster, client: redis.cluster.RedisCluster, mode: CommitMode
) -> None:
    topology = f"failover-{mode.value}"
    sink = opened(cluster.url, topology, key_prefix=PREFIX, mode=mode)
    batches = [batch(1, {"a": 1, "b": 2}), batch(2, {"a": 3}, dead=1), batch(3, {"c": 7})]
    for txid, prepared in enumerate(batches, start=1):
        assert sink.commit(TransactionAttempt(txid, 1), prepared) is CommitOutcome.APPLIED
    want = Counter({"a": 1 + 3, "b": 2, "c": 7})
    master = cluster.master_of(f"{PREFIX}words")
    master.stop()  # SIGKILL, right after txid 3 was reported done
    try:
        # The same committer finds the slot's new master once the failover is through
        # (until then: commit errors, which the runner retries). The new master has no
        # replica, so no commit is reported done there...
        deadline = time.monotonic() + 60
        while True:
            with pytest.raises(CommitError) as failed:
                sink.commit(TransactionAttempt(3, 2), batches[2])
            if "0 of the 1 replica(s)" in str(failed.value):
                break
            assert time.monotonic() < deadline, f"no failover within 60 s: {failed.value}"
            time.sleep(0.2)
        assert cluster.master_of(f"{PREFIX}words") is not master
        # ... until the old master is back, as its replica.
        master.start()
        cluster.wait_ok()
        again = CommitOutcome.REAPPLIED if mode is CommitMode.OPAQUE else CommitOutcome.SKIPPED
        assert sink.commit(TransactionAttempt(3, 3), batches[2]) is again
        assert master.info("info", "replication").get("role") == "slave"
        assert stored(client, topology) == (dict(want), 1, 3)
        assert sink.commit(TransactionAttempt(4, 1), batch(4, {"a": 1})) is CommitOutcome.APPLIED
        want["a"] += 1
        assert stored(client, topology) == (dict(want), 1, 4)
    finally:
        sink.close()
        if master.proc is None:
            master.start()
        cluster.wait_ok()


def _replica_of(cluster: RedisCluster, master: ClusterNode) -> ClusterNode:
    running = [node.port for node in cluster.nodes if node.proc is not None]
    ports = replicas_of(running, master.port)
    assert ports, f"no replica of {master.address}"
    return next(node for node in cluster.nodes if node.port == ports[0])


@pytest.fixture(scope="module")
def tweets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected]:
    return generated_tweets(tmp_path_factory.mktemp("input"), count=600, seed=9)


def cluster_txid(url: str) -> int:
    try:
        return redis_txid(url, "sink", prefix="{tweets}:", cluster=True)
    except redis.RedisError:
        return 0  # mid-failover


@pytest.mark.parametrize("spout", ["partitioned", "opaque"])
def test_the_demo_counts_exactly_through_a_master_failover(
    cluster: RedisCluster,
    client: redis.cluster.RedisCluster,
    tweets: tuple[Path, Expected],
    tmp_path: Path,
    spout: str,
) -> None:
    path, expected = tweets
    args = [
        "run", "--input", str(path), "--spout", spout,
        "--sink", "redis", "--redis-url", cluster.url, "--redis-key-prefix", "{tweets}:",
        "--state-dir", str(tmp_path / "state"), "--batch-size", "20",
        "--until-drained", "--top", "0", "--record-ids",
    ]  # fmt: skip
    run = DemoProcess(args, tmp_path / "run.log")
    deadline = time.monotonic() + 300
    while cluster_txid(cluster.url) < 2:
        assert run.poll() is None, run.tail()
        assert time.monotonic() < deadline, "nothing committed in time"
        time.sleep(0.05)
    master = cluster.master_of("{tweets}")
    replica = _replica_of(cluster, master)
    master.stop()  # SIGKILL the master of every key the topology writes
    try:
        at_kill = cluster_txid(cluster.url)
        # The failover, seen by the replica itself (the other nodes' slot maps follow
        # by gossip, later), while the run goes on.
        wait_promoted([replica.port], timeout=60)
        master.start()  # it rejoins as a replica
        assert run.wait(timeout=600) == 0, run.tail()
    finally:
        if run.poll() is None:
            run.kill()
        if master.proc is None:  # the cluster is the module's: whole for the next test
            master.start()
        cluster.wait_ok()
    assert cluster_txid(cluster.url) > at_kill  # txids were still to come at the kill
    # Commits failed while the slot had no master, and were retried.
    assert re.search(r"txid failed txid=\d+ phase=commit .*CommitError", run.log.read_text())
    verdict = judge(read_redis(cluster.url, "{tweets}:", cluster=True), expected)
    assert verdict.exact, str(verdict)
