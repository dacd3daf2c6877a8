"""The tweet demo on a three-server ZooKeeper ensemble (loopback, quorum config, separate
data directories): the leader server SIGKILLed mid-run and restarted later; two of the
three stopped (a minority left), during which nothing commits, until quorum returns and
the runner leads again within seconds.
Counts exact against answers computed from the input files (``tests.reference``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinators._zk import RECONNECT_MAX_S
from tests.history import judge, read_redis
from tests.processes import DemoProcess, generated_tweets, redis_txid
from tests.reference import Expected
from transactional.testing.cluster_servers import ZooKeeperEnsemble

pytestmark = pytest.mark.cluster


@pytest.fixture
def ensemble() -> Iterator[ZooKeeperEnsemble]:
    servers = ZooKeeperEnsemble(3)
    try:
        servers.start()
        yield servers
    finally:
        servers.close()


@pytest.fixture(scope="module")
def tweets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected]:
    return generated_tweets(tmp_path_factory.mktemp("input"), count=900, seed=8)


def start_run(hosts: str, redis_url: str, path: Path, tmp_path: Path) -> DemoProcess:
    args = [
        "run",
        "--input", str(path),
        "--spout", "partitioned",
        "--sink", "redis", "--redis-url", redis_url,
        "--zookeeper", hosts,
        "--zk-session-timeout", "6",
        "--batch-size", "15",
        "--until-drained",
        "--master", "local[2]",
        "--top", "0",
        "--record-ids",
    ]  # fmt: skip
    return DemoProcess(args, tmp_path / "run.log")


def wait_committed(run: DemoProcess, redis_url: str, txid: int, timeout: float = 240) -> int:
    deadline = time.monotonic() + timeout
    while (held := redis_txid(redis_url, "sink")) < txid:
        assert run.proc.poll() is None, run.log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"txid {txid} not committed in {timeout}s"
        time.sleep(0.05)
    return held


def test_the_leader_server_killed_mid_run_and_restarted(
    ensemble: ZooKeeperEnsemble, redis_url: str, tweets: tuple[Path, Expected], tmp_path: Path
) -> None:
    path, expected = tweets
    run = start_run(ensemble.hosts, redis_url, path, tmp_path)
    wait_committed(run, redis_url, 2)
    leader = ensemble.wait_serving()
    leader.stop()  # SIGKILL the ZooKeeper leader: the other two elect a new one
    at_kill = redis_txid(redis_url, "sink")
    ensemble.wait_serving()
    wait_committed(run, redis_url, at_kill + 2)  # commits go on under the new leader
    leader.start()
    assert run.proc.wait(timeout=600) == 0, run.log.read_text()[-3000:]
    assert redis_txid(redis_url, "sink") > at_kill + 1
    verdict = judge(read_redis(redis_url), expected)
    assert verdict.exact, str(verdict)


def test_a_minority_commits_nothing_until_quorum_returns(
    ensemble: ZooKeeperEnsemble, redis_url: str, tweets: tuple[Path, Expected], tmp_path: Path
) -> None:
    path, expected = tweets
    run = start_run(ensemble.hosts, redis_url, path, tmp_path)
    wait_committed(run, redis_url, 2)
    stopped = ensemble.members[:2]
    for member in stopped:
        member.stop()  # one of three left: no quorum
    # The runner's own report: it lost the leadership and cannot get it back. A commit
    # it handed to its commit thread before it noticed may still land; none after that.
    run.wait_said(r"leadership lost topology=", timeout=120)
    run.wait_said(r"still trying to lead topology=\S+ tries=25 ", timeout=120)
    without_quorum = redis_txid(redis_url, "sink")
    # Twenty-five more tries (each at least a pause apart), and still nothing committed.
    run.wait_said(r"still trying to lead topology=\S+ tries=50 ", timeout=120)
    assert redis_txid(redis_url, "sink") == without_quorum
    assert "leadership taken back" not in run.output()
    stopped[0].start()  # two of three: quorum again
    ensemble.wait_serving()
    # Back within a few of its reconnect pauses (at most RECONNECT_MAX_S each), not after
    # the pause of over a minute that kazoo's own doubling reaches in an outage this long.
    run.wait_said(r"leadership taken back topology=", timeout=RECONNECT_MAX_S * 15)
    assert run.wait(timeout=600) == 0, run.tail()  # it kept trying, never gave up
    assert redis_txid(redis_url, "sink") > without_quorum
    verdict = judge(read_redis(redis_url), expected)
    assert verdict.exact, str(verdict)
