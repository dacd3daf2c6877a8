"""Network faults between the demo and its servers, made by a TCP proxy the test controls
(``transactional.testing.proxy``), each shown to have happened by what the proxy and
the servers saw, not by the run's word: a leader partitioned from ZooKeeper while a
commit of its is held on the wire, delivered once a new leader has committed (the Redis
server's own account, ``tests.monitor``, shows it arrive and write nothing), a Redis
connection whose reply is lost after the
commit's script was sent (the unknown-outcome rule), and a Kafka broker that stops
answering while Spark reads a batch from it. The sinks are judged record by
record (``tests.history``) against answers from the input files."""

from __future__ import annotations

import io
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from examples.tweets.cli import main as demo
from tests.history import judge, read_redis
from tests.monitor import ScriptWrites
from tests.processes import DemoProcess, generated_tweets, redis_txid
from tests.reference import Expected
from tests.witness import waited, zk_owner
from transactional.testing.proxy import TcpProxy
from transactional.testing.servers import KafkaServer, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

STARTED = r"runner started topology=tweets currtx=(\d+) .*fence=(\d+)"
LEADER_NODE = "/transactional/tweets/leader"


@pytest.fixture(scope="module")
def tweets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected]:
    return generated_tweets(tmp_path_factory.mktemp("input"), count=600, seed=12)


@pytest.fixture
def runs() -> Iterator[list[DemoProcess]]:
    started: list[DemoProcess] = []
    yield started
    for run in started:
        if run.poll() is None:
            run.kill()


def port_of(address: str) -> int:
    found = re.search(r":(\d+)(/|$)", address)
    assert found, address
    return int(found.group(1))


def demo_args(
    path: Path | None, redis_url: str, *more: str, spout: str = "transactional"
) -> list[str]:
    """``run`` of the demo into Redis, each tweet also counted by id; from the files
    under ``path`` (None: ``more`` names the source)."""
    source = [] if path is None else ["--input", str(path)]
    return [
        "-vv", "run", *source, "--spout", spout,
        "--sink", "redis", "--redis-url", redis_url, "--batch-size", "20",
        "--master", "local[1]", "--top", "0", "--record-ids", *more,
    ]  # fmt: skip


def fence_held(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.get("transactional:tweets:sink:fence") or 0)
    finally:
        client.close()


def test_a_leader_cut_off_from_zookeeper_mid_commit_commits_nothing_once_replaced(
    tweets: tuple[Path, Expected],
    redis_url: str,
    zk_hosts: str,
    tmp_path: Path,
    runs: list[DemoProcess],
) -> None:
    # The Redis server's own account of every commit: the old leader's, held on the wire
    # past the takeover, reaches it after the new leader's and writes nothing.
    with ScriptWrites(redis_url, tmp_path / "monitor.log") as writes:
        old, new = cut_off_then_replaced(tweets, redis_url, zk_hosts, tmp_path, runs)
    fences = writes.fences()
    assert old in fences[fences.index(new) :], fences  # it arrived after
    assert writes.deposed() == [], writes.deposed()[:10]  # ...and wrote nothing
    assert writes.outside() == [], writes.outside()[:10]


def cut_off_then_replaced(
    tweets: tuple[Path, Expected],
    redis_url: str,
    zk_hosts: str,
    tmp_path: Path,
    runs: list[DemoProcess],
) -> tuple[int, int]:
    """The old leader's and the new one's fence tokens."""
    path, expected = tweets
    # The leader reaches ZooKeeper through one proxy and Redis through another, which
    # holds a commit's script on the wire while ZooKeeper is cut off, until the new
    # leader has committed. The standby reaches both directly, and leads until it is
    # told to stop.
    session = ["--zk-session-timeout", "4", "--topology-id", "tweets"]
    with TcpProxy(port_of(zk_hosts)) as to_zk, TcpProxy(port_of(redis_url)) as to_redis:
        through = redis_url.replace(f":{port_of(redis_url)}", f":{to_redis.port}")
        zk_through = zk_hosts.replace(f":{port_of(zk_hosts)}", f":{to_zk.port}")  # same chroot
        leader = DemoProcess(
            demo_args(path, through, "--zookeeper", zk_through, *session), tmp_path / "a.log"
        )
        runs.append(leader)
        old_fence = int(leader.wait_said(STARTED, timeout=120).group(2))
        standby = DemoProcess(
            demo_args(path, redis_url, "--zookeeper", zk_hosts, *session), tmp_path / "b.log"
        )
        runs.append(standby)
        standby.wait_said(r"acquiring leadership topology=tweets", timeout=120)
        waited("a first commit", lambda: redis_txid(redis_url, "sink") >= 1 or None, 240)
        owner = zk_owner(zk_hosts, LEADER_NODE)
        assert owner is not None and not re.search(STARTED, standby.output())
        # A commit of the leader's, past its leadership check, held on its way to Redis...
        to_redis.hold(b"EVALSHA")
        to_redis.wait_in_flight(b"EVALSHA", timeout_s=120)
        to_zk.black_hole()  # ...when the leader loses ZooKeeper.
        cut_off = len(leader.output())
        # ZooKeeper itself expires the leader's session; the standby takes over.
        waited(
            "ZooKeeper to give the leader node to another session",
            lambda: zk_owner(zk_hosts, LEADER_NODE) not in (owner, None) or None,
            60,
        )
        started = standby.wait_said(STARTED, timeout=120)
        currtx, fence = int(started.group(1)), int(started.group(2))

        def new_commit() -> bool | None:
            return redis_txid(redis_url, "sink") >= currtx or None

        waited("a commit of the new leader", new_commit, 240)
        to_redis.release()  # the old leader's script reaches Redis now
        assert to_zk.stats["discarded_up"] > 0  # the old leader's heartbeats went nowhere
        to_zk.heal()
        # The old leader finds it was replaced and stops; what it reported committed once
        # cut off, it had committed before the new leader started (below its currtx).
        assert leader.wait(timeout=180) == 1, leader.tail()
        after = leader.output()[cut_off:]
        assert re.search(r"error: (LostLeadershipError|FencedError): ", after), after
        late = [int(t) for t in re.findall(r"txid committed txid=(\d+)", after)]
        assert all(t < currtx for t in late), (late, currtx)

    def whole() -> bool | None:
        return judge(read_redis(redis_url), expected).exact or None

    waited("the new leader to count the whole input", whole, 300)
    standby.proc.send_signal(signal.SIGINT)
    assert standby.wait(timeout=120) == 130, standby.tail()
    assert fence_held(redis_url) == fence  # the sink holds the new leader's token
    verdict = judge(read_redis(redis_url), expected)
    assert verdict.exact, str(verdict)
    return old_fence, fence


def test_a_commit_whose_reply_is_lost_on_the_wire_is_applied_once(
    tweets: tuple[Path, Expected], redis_url: str, tmp_path: Path, runs: list[DemoProcess]
) -> None:
    path, expected = tweets
    with TcpProxy(port_of(redis_url)) as to_redis:
        through = redis_url.replace(f":{port_of(redis_url)}", f":{to_redis.port}")
        state = ["--state-dir", str(tmp_path / "state")]
        args = demo_args(path, f"{through}?socket_timeout=2", "--until-drained", *state)
        run = DemoProcess(args, tmp_path / "run.log")
        runs.append(run)
        waited("a first commit", lambda: redis_txid(redis_url, "sink") >= 1 or None, 240)
        before = redis_txid(redis_url, "sink")
        # From now on Redis gets every request and its commit scripts' replies are lost
        # (only theirs: a new connection's handshake must not be the reply that is lost).
        to_redis.half_open(b"EVALSHA")
        # A commit's script reached Redis, its reply never came back...
        to_redis.wait_lost_reply(b"EVALSHA", timeout_s=120)

        # ...and it took effect: Redis holds a txid the runner was never told of.
        def landed() -> bool | None:
            return redis_txid(redis_url, "sink") > before or None

        waited("the script's txid in Redis", landed, 30)
        to_redis.heal()
        assert run.wait(timeout=300) == 0, run.tail()
    # The runner's commit failed without a reply; it read the txid from the sink (the
    # unknown-outcome rule) rather than commit it again: at once, or, with the sink
    # unreadable then too, on the replay, which the sink skipped.
    text = run.output()
    resolved = re.search(r"commit raised but the sink holds the txid committer=sink", text)
    skipped = re.search(r"txid committed txid=\d+ .*SKIPPED", text)
    assert resolved or skipped, text[-3000:]
    verdict = judge(read_redis(redis_url), expected)
    assert verdict.exact, str(verdict)


def test_a_kafka_broker_stalled_mid_read_is_read_again_exactly(
    tweets: tuple[Path, Expected], redis_url: str, tmp_path: Path, runs: list[DemoProcess]
) -> None:
    path, expected = tweets
    # The broker tells its clients the proxy's address, so every connection of the run
    # goes through the proxy: the driver's admin client and Spark's readers in tasks.
    port = free_port()
    broker = KafkaServer(advertised_port=port)
    try:
        with TcpProxy(broker.port, port=port) as to_kafka:
            broker.start()
            via = f"127.0.0.1:{port}"
            load = ["load", "--input", str(path), "--kafka", via, "--topic", "tweets"]
            out = io.StringIO()
            assert demo(load, out=out) == 0, out.getvalue()
            source = ["--source", "kafka", "--kafka", via, "--topic", "tweets"]
            state = ["--state-dir", str(tmp_path / "state"), "--until-drained"]
            args = demo_args(None, redis_url, *source, *state, spout="partitioned")
            # A read of Spark's (a request of an executor's consumer, whose client id
            # Kafka names after the topology's consumer group) on its way to the broker
            # when the broker stops answering anyone. The driver's clients are admin
            # clients, Spark's (``adminclient-N``) and the spout's (``rdkafka``), and go
            # on unheld. The first read is the one held: a topology's consumers are
            # pooled across its reads, with what they fetched, so the 600 tweets come in
            # the first fetch of each partition and later txids may send no request.
            reader = b"consumer-transactional-"
            to_kafka.delay_only, to_kafka.delay_s = reader, 1.0
            run = DemoProcess(args, tmp_path / "run.log")
            runs.append(run)
            to_kafka.wait_in_flight(reader, timeout_s=240)
            to_kafka.black_hole()
            to_kafka.delay_s = 0.0
            connections = to_kafka.stats["connections"]
            # The stall lasts until a client gave up on its connection and tried anew
            # (the reader's consumer, after its request timeout).
            waited(
                "a client of the broker to reconnect during the stall",
                lambda: to_kafka.stats["connections"] > connections or None,
                120,
            )
            assert to_kafka.stats["discarded_up"] > 0  # the read went nowhere
            to_kafka.heal()
            # The reader asks again once the broker answers; the run drains.
            assert run.wait(timeout=600) == 0, run.tail()
    finally:
        broker.close()
    verdict = judge(read_redis(redis_url), expected)
    assert verdict.exact, str(verdict)
