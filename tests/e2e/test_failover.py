"""Two demo processes on one topology id and one ZooKeeper: exactly one leads, the other
waits; a leader killed with SIGKILL is replaced, and a leader frozen with SIGSTOP past
its session is deposed and, resumed, writes nothing: by its own log, and by the Redis
server's account of every commit script (``tests.monitor``: none wrote under a token
below one that had). Counts are checked exactly against an answer computed here from
the input files."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from committers import decode_key
from examples.tweets.cli import main as demo
from tests.jvm import short_lived
from tests.monitor import ScriptWrites
from tests.processes import DEMO_RUNS, demo_command
from tests.reference import Expected, expected_counts
from tests.witness import zk_owner

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = "failover"
SINK = f"transactional:{TOPOLOGY}:sink"
BATCH = 80
STARTED = "runner started topology=failover"
WAITING = "acquiring leadership topology=failover"


@pytest.fixture(scope="module")
def tweets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected, int]:
    out = tmp_path_factory.mktemp("failover") / "tweets"
    code = demo(
        [
            "generate",
            "--count",
            "240",
            "--seed",
            "3",
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
    return out, expected_counts(out), 240 // BATCH


class Runner:
    """One ``python -m examples.tweets run`` process, its log in a file."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        env = short_lived({**os.environ, "PYTHONPATH": str(ROOT)})
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*demo_command(env), *args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        DEMO_RUNS["started"] += 1

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            DEMO_RUNS["killed"] += self.proc.wait() == -signal.SIGKILL


@pytest.fixture
def runners(
    tweets: tuple[Path, Expected, int], redis_url: str, zk_hosts: str, tmp_path: Path
) -> Iterator[Callable[[bool], tuple[Runner, Runner]]]:
    started: list[Runner] = []

    def start_two(until_drained: bool) -> tuple[Runner, Runner]:
        args = [
            "-vv",
            "run",
            "--input",
            str(tweets[0]),
            "--spout",
            "transactional",
            "--sink",
            "redis",
            "--redis-url",
            redis_url,
            "--zookeeper",
            zk_hosts,
            "--topology-id",
            TOPOLOGY,
            "--zk-session-timeout",
            "4",
            "--batch-size",
            str(BATCH),
            "--max-pending",
            "2",
            "--master",
            "local[1]",
            "--top",
            "0",
        ]
        if until_drained:
            args.append("--until-drained")
        for name in ("a", "b"):
            state = ["--state-dir", str(tmp_path / name)]
            started.append(Runner(args + state, tmp_path / f"{name}.log"))
        return started[0], started[1]

    yield start_two
    for runner in started:
        runner.kill()


def wait_for(
    what: str, condition: Callable[[], bool], *alive: Runner, timeout: float = 240
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for runner in alive:
            assert runner.proc.poll() is None, f"exited while waiting for {what}:\n{runner.text()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def roles(a: Runner, b: Runner) -> tuple[Runner, Runner]:
    """(leader, standby) once both are up: the standby waits at the leadership."""
    wait_for(
        "one leader and one standby",
        lambda: (
            sum(STARTED in r.text() for r in (a, b)) == 1
            and all(WAITING in r.text() for r in (a, b))
        ),
        a,
        b,
    )
    return (a, b) if STARTED in a.text() else (b, a)


def committed(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.get(f"{SINK}:txid") or 0)
    finally:
        client.close()


def fence_of(runner: Runner) -> int:
    found = re.findall(rf"{STARTED} currtx=(\d+) .*fence=(\d+)", runner.text())
    assert len(found) == 1, runner.text()
    return int(found[0][1])


def assert_exact(url: str, expected: Expected) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        assert Counter({k: int(v) for k, v in client.hgetall("hashtags").items()}) == (
            expected.hashtags
        )
        assert Counter({k: int(v) for k, v in client.hgetall("users").items()}) == expected.users
        fields = client.hgetall("users_hashtags")
        assert Counter({decode_key(k, 2): int(v) for k, v in fields.items()}) == expected.pairs
        dead = [json.loads(v)["raw"] for v in client.lrange("dead_letters", 0, -1)]
        assert sorted(dead) == sorted(expected.dead_letters)
    finally:
        client.close()


def test_one_runner_leads_and_a_standby_takes_over_when_it_is_killed(
    runners: Callable[[bool], tuple[Runner, Runner]],
    tweets: tuple[Path, Expected, int],
    redis_url: str,
    zk_hosts: str,
) -> None:
    _, expected, last = tweets
    leader, standby = roles(*runners(True))
    # The sink, then the store: the log line comes once both hold txid 1.
    wait_for("a first commit", lambda: "txid committed" in leader.text(), leader, standby)
    owner = zk_owner(zk_hosts, f"/transactional/{TOPOLOGY}/leader")
    # The standby waits for the leadership: it has started no txid, committed nothing.
    assert owner is not None and committed(redis_url) >= 1
    assert STARTED not in standby.text() and "txid started" not in standby.text()

    leader.kill()  # SIGKILL, JVM and all: its session ends only when it times out
    killed_at = committed(redis_url)
    assert killed_at < last
    assert standby.proc.wait(timeout=300) == 0, standby.text()
    resumed = re.findall(rf"{STARTED} currtx=(\d+)", standby.text())
    assert resumed and int(resumed[0]) >= killed_at  # took over where the leader stood
    assert committed(redis_url) == last
    assert fence_of(standby) > fence_of(leader)
    assert_exact(redis_url, expected)


def test_a_leader_frozen_past_its_session_is_deposed_and_writes_nothing_once_resumed(
    runners: Callable[[bool], tuple[Runner, Runner]],
    tweets: tuple[Path, Expected, int],
    redis_url: str,
    tmp_path: Path,
) -> None:
    # The Redis server's own account of every commit: none under a deposed token.
    with ScriptWrites(redis_url, tmp_path / "monitor.log") as writes:
        frozen_then_resumed(runners, tweets, redis_url)
    assert writes.deposed() == [], writes.deposed()[:10]
    assert writes.outside() == [], writes.outside()[:10]


def frozen_then_resumed(
    runners: Callable[[bool], tuple[Runner, Runner]],
    tweets: tuple[Path, Expected, int],
    redis_url: str,
) -> None:
    _, expected, last = tweets
    # Without --until-drained: the new leader keeps leading until it is told to stop.
    leader, standby = roles(*runners(False))
    wait_for("a first commit", lambda: committed(redis_url) >= 1, leader, standby)
    os.kill(leader.proc.pid, signal.SIGSTOP)  # the driver, where its ZooKeeper session lives
    logged_before = len(leader.text())
    try:
        frozen_at = committed(redis_url)
        assert frozen_at < last
        wait_for("the standby to take over", lambda: STARTED in standby.text(), standby)
        wait_for("its first commit", lambda: committed(redis_url) > frozen_at, standby)
    finally:
        os.kill(leader.proc.pid, signal.SIGCONT)

    # Resumed, it finds it was deposed (a refused commit, a refused store write, or the
    # leadership held by the standby) and stops with an error, exit code 1.
    assert leader.proc.wait(timeout=120) == 1, leader.text()
    text = leader.text()
    assert re.search(r"error: (LostLeadershipError|FencedError): ", text), text
    after = text[logged_before:]  # all it logged once resumed
    assert "deposed" in after, after
    # It committed nothing more: a "txid committed" line it prints once resumed can only
    # be the acknowledgment of a txid it had committed before it froze (SIGSTOP may land
    # between a store advance and its log line).
    late = [int(t) for t in re.findall(r"txid committed txid=(\d+)", after)]
    assert all(t <= frozen_at for t in late), (late, frozen_at, after)
    wait_for("the standby to commit everything", lambda: committed(redis_url) == last, standby)
    # Its token is below the standby's, and the sink only ever holds the highest token.
    client = redis.Redis.from_url(redis_url)
    assert int(client.get(f"{SINK}:fence") or 0) == fence_of(standby) > fence_of(leader)
    client.close()

    standby.proc.send_signal(signal.SIGINT)  # the poller never stops by itself
    assert standby.proc.wait(timeout=120) == 130, standby.text()  # "interrupted"
    assert committed(redis_url) == last
    assert_exact(redis_url, expected)
