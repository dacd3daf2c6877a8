"""Every flag of the demo (``python -m examples.tweets``) reaches what it controls.

``run``: the command runs in this process as a user runs it (``main([...])``: options
checked, servers reached, spout, committers and store built from the flags), with the
two things that would start Spark replaced by recorders (the session's start and the
runner), so that what ``run`` hands them can be read back; the runner's own settings
are the same flags as ``transactional run``'s, from one table, and are checked with
the same values (``tests/integration/test_cli_flags.py``). ``generate``, ``load`` and
``show`` run for real against real Redis and Kafka. The cases are walked from the
parser: a flag added without a case fails ``test_every_flag_has_a_case``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from coordinators import SQLiteStateStore, ZooKeeperStateStore
from examples.tweets import cli as demo
from examples.tweets import sources as redis_sources
from tests.integration.test_cli_flags import RUNNER_VALUES, runner_args
from transactional.cli.settings import RUNNER_ONLY, settings_of
from transactional.config import RunnerConfig
from transactional.faults import CombinedFaults, FaultPoint, KillAt, RandomFaults
from transactional.flow import AdaptiveBatchSize
from transactional.runner import RunStats
from transactional.sources.files import FilesOpaqueSpout
from transactional.sources.kafka import KafkaPartitionedSpout
from transactional.testing.servers import KafkaServer
from transactional.types import CommitMode

pytestmark = pytest.mark.integration


@dataclass
class World:
    tmp: Path
    redis: str
    zk: str
    kafka: str
    topic: str
    #: What ``run`` handed over: the session's arguments, the runner's, run()'s.
    spark: dict[str, Any] = field(default_factory=dict)
    runner: dict[str, Any] = field(default_factory=dict)
    until_drained: bool | None = None
    out: str = ""

    def fill(self, text: str) -> str:
        return text.format(
            tmp=self.tmp, redis=self.redis, zk=self.zk, kafka=self.kafka, topic=self.topic
        )

    @property
    def config(self) -> RunnerConfig:
        value = self.runner["config"]
        assert isinstance(value, RunnerConfig)
        return value

    @property
    def spout(self) -> Any:
        return self.runner["topology"].spout

    @property
    def committers(self) -> dict[str, Any]:
        return {n.name: n.committer for n in self.runner["topology"].committers}


class Session:
    """Stands for the session ``run`` would start; it only gets stopped."""

    def stop(self) -> None:
        pass


@pytest.fixture(scope="module")
def topic(kafka: KafkaServer) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    # A name of its own: the fixture may be set up again in one broker's life (pytest
    # tears a module's fixture down when the tests of several modules interleave).
    name = f"demo-flags-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for future in admin.create_topics([NewTopic(name, 2, 1)]).values():
        future.result(timeout=60)
    return name


@pytest.fixture
def world(
    tmp_path: Path,
    redis_url: str,
    zk_hosts: str,
    kafka: KafkaServer,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[World]:
    w = World(tmp_path, redis_url, zk_hosts, kafka.bootstrap_servers, topic)

    def start_spark(
        master: str,
        sink: str,
        state_dir: Path,
        spout: Any,
        settings: Any,
        delta_path: Any,
        remote: str | None = None,
    ) -> Any:
        w.spark = {"master": master, "sink": sink, "state_dir": state_dir, "conf": settings}
        w.spark.update(delta_path=delta_path, remote=remote)
        return Session()

    class Runner:
        def __init__(self, topology: Any, store: Any, spark: Any, config: Any, **kw: Any):
            w.runner = {"topology": topology, "store": store, "config": config, **kw}

        def run(self, until_drained: bool = False) -> RunStats:
            w.until_drained = until_drained
            return RunStats()

        def stop(self) -> None:
            pass

    monkeypatch.setattr("examples.tweets.commands.start_spark", start_spark)
    monkeypatch.setattr("transactional.runner.TransactionalRunner", Runner)
    for name in [n for n in os.environ if n.startswith("TRANSACTIONAL_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    assert demo.main(["generate", "--count", "40", "--out", str(tmp_path / "in")]) == 0
    yield w


def main(w: World, *argv: str) -> int:
    import io

    out = io.StringIO()
    code = demo.main([w.fill(a) for a in argv], out)
    w.out = out.getvalue()
    return code


def run(w: World, *argv: str) -> None:
    base = ["run", "--top", "0", "--state-dir", "{tmp}/st", "--delta-path", "{tmp}/delta"]
    if "--sink" in argv and "redis" in argv:
        base = base[:-2]  # --delta-path is refused with --sink redis
    assert main(w, *base, *argv) == 0, w.out


Check = Callable[[World], None]


def case(*argv: str, then: Callable[[World], object]) -> Check:
    def check(w: World) -> None:
        run(w, *argv)
        assert then(w) is not False

    return check


REDIS_SOURCE = ("--source", "redis", "--redis-url", "{redis}", "--sink", "redis")
KAFKA_SOURCE = ("--source", "kafka", "--kafka", "{kafka}", "--topic", "{topic}")


def _top(w: World) -> None:
    client = redis.Redis.from_url(w.redis)
    client.hset("hashtags", mapping={"#a": 5, "#b": 3, "#c": 1})
    client.close()
    base = ["run", "--state-dir", "{tmp}/st", "--sink", "redis", "--redis-url", "{redis}"]
    assert main(w, *base, "--top", "2") == 0
    rows = [line for line in w.out.splitlines() if line.startswith("│")]
    assert [r.split()[1] for r in rows] == ["#a", "#b"]  # the top 2, no third


def _runner_case(name: str) -> Check:
    expected = RUNNER_VALUES[name][1]

    def check(w: World) -> None:
        run(w, *runner_args(name))
        assert getattr(w.config, name) == expected

    return check


def _no_warm_up(w: World) -> None:
    run(w, "--no-warm-up")
    assert w.config.warm_up is False


RUN_CASES: dict[str, Check] = {
    "--source": case(*REDIS_SOURCE, then=lambda w: type(w.spout) is redis_sources.RedisPartitionedSpout),
    "--input": case("--input", "{tmp}/in", then=lambda w: w.spout.path == str(w.tmp / "in")),
    "--spout": case(
        "--spout", "opaque",
        then=lambda w: type(w.spout) is FilesOpaqueSpout
        and w.committers["sink"].mode is CommitMode.OPAQUE,
    ),
    "--prefix": case(*REDIS_SOURCE, "--prefix", "q", then=lambda w: w.spout.prefix == "q"),
    "--kafka": case(
        *KAFKA_SOURCE,
        then=lambda w: type(w.spout) is KafkaPartitionedSpout
        and w.spout.bootstrap_servers == w.kafka,
    ),
    "--topic": case(*KAFKA_SOURCE, then=lambda w: w.spout.topic == w.topic),
    "--zookeeper": case(
        "--zookeeper", "{zk}",
        then=lambda w: isinstance(w.runner["store"], ZooKeeperStateStore)
        and w.runner["store"].hosts == w.zk,
    ),
    "--zk-session-timeout": case(
        "--zookeeper", "{zk}", "--zk-session-timeout", "3.5",
        then=lambda w: w.runner["store"].session_timeout == 3.5,
    ),
    "--sink": case(
        "--sink", "both", "--redis-url", "{redis}",
        then=lambda w: sorted(type(c).__name__ for c in w.committers.values())
        == ["DeltaCommitter", "RedisCommitter"],
    ),
    "--delta-path": case(
        "--delta-path", "{tmp}/lake", then=lambda w: w.committers["sink"].path == str(w.tmp / "lake")
    ),
    "--redis-url": case(
        "--sink", "redis", "--redis-url", "{redis}", then=lambda w: w.committers["sink"].url == w.redis
    ),
    "--redis-key-prefix": case(
        "--sink", "redis", "--redis-url", "{redis}", "--redis-key-prefix", "{{t}}:",
        then=lambda w: w.committers["sink"].key_prefix == "{t}:",
    ),
    "--state-dir": case(
        then=lambda w: isinstance(w.runner["store"], SQLiteStateStore)
        and Path(w.runner["store"].path).resolve() == w.tmp / "st" / "state.db"
        and w.spark["state_dir"].resolve() == w.tmp / "st",
    ),
    "--top": _top,
    "--master": case("--master", "local[1]", then=lambda w: w.spark["master"] == "local[1]"),
    "--remote": case(
        "--remote", "sc://spark.example:15002",
        then=lambda w: w.spark["remote"] == "sc://spark.example:15002",
    ),
    "--conf": case(
        "--conf", "spark.sql.shuffle.partitions=3",
        then=lambda w: w.spark["conf"] == {"spark.sql.shuffle.partitions": "3"},
    ),
    "--batch-size": case("--batch-size", "7", then=lambda w: w.spout.batch_size == 7),
    "--target-latency": case(
        "--batch-size", "auto", "--target-latency", "4",
        then=lambda w: isinstance(w.runner["batch_size"], AdaptiveBatchSize)
        and w.runner["batch_size"].config.target_latency_s == 4.0,
    ),
    "--topology-id": case("--topology-id", "other", then=lambda w: w.config.topology_id == "other"),
    "--until-drained": case("--until-drained", then=lambda w: w.until_drained is True),
    "--record-ids": case(
        "--record-ids", then=lambda w: "tweet_ids" in w.committers["sink"].state_names()
    ),
    "--fail-rate": case(
        "--fail-rate", "0.25",
        then=lambda w: isinstance(w.runner["faults"], RandomFaults)
        and w.runner["faults"].rate == 0.25,
    ),
    "--fail-seed": case(
        "--fail-rate", "0.25", "--fail-seed", "9", then=lambda w: w.runner["faults"].seed == 9
    ),
    "--crash-at": case(
        "--fail-rate", "0.1", "--crash-at", "emit:2",
        then=lambda w: isinstance(w.runner["faults"], CombinedFaults)
        and any(
            isinstance(p, KillAt) and p.targets == {(FaultPoint.EMIT, 2)}
            for p in w.runner["faults"].plans
        ),
    ),
    **{s.flag: _runner_case(s.name) for s in settings_of(RUNNER_ONLY)},
    # A switch both ways (default None: only with --batch-size auto): its other half.
    "--no-warm-up": _no_warm_up,
}  # fmt: skip


def _generate(w: World) -> None:
    out = w.tmp / "g"
    argv = ["generate", "--count", "30", "--seed", "3", "--out", str(out), "--partitions", "2"]
    assert main(w, *argv, "--bad-rate", "0.5") == 0
    files = sorted(out.iterdir())
    lines = [line for f in files for line in f.read_text().splitlines()]
    assert [f.name for f in files] == ["part-00000.jsonl", "part-00001.jsonl"]  # --partitions
    assert len(lines) == 30  # --count

    def good(line: str) -> bool:
        try:
            tweet = json.loads(line)
        except ValueError:
            return False
        return isinstance(tweet, dict) and isinstance(tweet.get("text"), str)

    assert 0 < sum(not good(line) for line in lines) < 30  # --bad-rate
    again, other = w.tmp / "again.jsonl", w.tmp / "other.jsonl"
    assert main(w, "generate", "--count", "30", "--seed", "3", "--out", str(again)) == 0
    assert main(w, "generate", "--count", "30", "--seed", "4", "--out", str(other)) == 0
    assert all(good(line) for line in again.read_text().splitlines())  # no --bad-rate
    assert again.read_bytes() != other.read_bytes()  # --seed
    assert main(w, "generate", "--count", "30", "--seed", "3", "--out", str(other)) == 0
    assert again.read_bytes() == other.read_bytes()


def _load_redis(w: World) -> None:
    """The queues' layout (``examples.tweets.lines``): ``<prefix>:<p>:<i>`` holds line
    ``i`` of file ``p``, ``<prefix>:<p>:next_write`` how many there are."""
    lines = (w.tmp / "in").read_bytes().splitlines()
    argv = ["load", "--input", "{tmp}/in", "--redis-url", "{redis}", "--prefix", "q"]
    assert main(w, *argv) == 0
    client = redis.Redis.from_url(w.redis)
    try:
        assert client.get("q:0:next_write") == b"40"  # --input, --prefix
        assert [client.get(f"q:0:{i}") for i in (0, 39)] == [lines[0], lines[39]]
        assert main(w, *argv) == 2  # a second load would count twice: refused
        assert client.get("q:0:next_write") == b"40"
        assert main(w, *argv, "--append") == 0  # on purpose
        assert client.get("q:0:next_write") == b"80"
        assert client.get("q:0:79") == lines[39]
    finally:
        client.close()


def _load_kafka(w: World) -> None:
    from confluent_kafka.admin import AdminClient

    argv = ["load", "--input", "{tmp}/in", "--kafka", "{kafka}", "--topic", "loaded"]
    assert main(w, *argv) == 0
    topics = AdminClient({"bootstrap.servers": w.kafka}).list_topics(timeout=30).topics
    assert "loaded" in topics and len(topics["loaded"].partitions) == 1


def _show_redis(w: World) -> None:
    client = redis.Redis.from_url(w.redis)
    client.hset("p:hashtags", mapping={"#a": 5, "#b": 3, "#c": 1})
    client.close()
    argv = ["show", "--sink", "redis", "--redis-url", "{redis}", "--redis-key-prefix", "p:"]
    assert main(w, *argv, "--top", "2") == 0
    rows = [line for line in w.out.splitlines() if line.startswith("│")]
    assert [r.split()[1] for r in rows] == ["#a", "#b"]


def _show_delta(w: World) -> None:
    assert main(w, "show", "--sink", "delta", "--delta-path", "{tmp}/nothing") == 2
    assert main(w, "show", "--sink", "delta", "--state-dir", "{tmp}/nostate") == 2


OTHER_CASES: dict[tuple[str, str], Check | str] = {
    **{("generate", f): _generate for f in ("--count", "--seed", "--out", "--partitions", "--bad-rate")},
    **{("load", f): _load_redis for f in ("--input", "--redis-url", "--prefix", "--append")},
    ("load", "--kafka"): _load_kafka,
    ("load", "--topic"): _load_kafka,
    **{("show", f): _show_redis for f in ("--sink", "--redis-url", "--redis-key-prefix", "--top")},
    ("show", "--delta-path"): "tests/e2e/test_demo.py::test_demo_with_injected_failures_counts_exactly",
    ("show", "--state-dir"): _show_delta,
}  # fmt: skip


def flags(command: str) -> set[str]:
    parser = demo.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        flag
        for a in sub.choices[command]._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction)
        for flag in a.option_strings
        if flag == max(a.option_strings, key=len) or flag.startswith("--")
    }


def test_every_flag_has_a_case() -> None:
    top = demo.build_parser()
    assert {max(a.option_strings, key=len) for a in top._actions if a.option_strings} == {
        "--help",
        "--verbose",
    }
    assert flags("run") == set(RUN_CASES)
    for command in ("generate", "load", "show"):
        assert flags(command) == {f for c, f in OTHER_CASES if c == command}, command


@pytest.mark.parametrize("flag", sorted(RUN_CASES))
def test_a_flag_of_run_reaches_what_it_controls(flag: str, world: World) -> None:
    RUN_CASES[flag](world)


def test_verbose(world: World) -> None:
    assert main(world, "-v", "run", "--top", "0", "--state-dir", "{tmp}/st") == 0
    assert logging.getLogger().level == logging.INFO
    assert main(world, "-vv", "run", "--top", "0", "--state-dir", "{tmp}/st") == 0
    assert logging.getLogger().level == logging.DEBUG


@pytest.mark.parametrize(
    "case",
    sorted({v.__name__: k for k, v in OTHER_CASES.items() if callable(v)}.values()),
    ids="-".join,
)
def test_a_flag_of_generate_load_and_show(case: tuple[str, str], world: World) -> None:
    check = OTHER_CASES[case]
    assert callable(check)
    check(world)
