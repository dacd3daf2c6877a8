"""Two demo processes on one topology id and one ZooKeeper: exactly one leads, the other
waits; a leader killed with SIGKILL is replaced. Counts are checked exactly against an
answer computed here from the input files. (Leaders frozen, partitioned and expired
while others take over: ``tests/e2e/test_contention.py``.)"""

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
) -> Iterator[Callable[[], tuple[Runner, Runner]]]:
    started: list[Runner] = []

    def start_two() -> tuple[Runner, Runner]:
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
            "--until-drained",
        ]
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
    runners: Callable[[], tuple[Runner, Runner]],
    tweets: tuple[Path, Expected, int],
    redis_url: str,
    zk_hosts: str,
) -> None:
    _, expected, last = tweets
    leader, standby = roles(*runners())
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
