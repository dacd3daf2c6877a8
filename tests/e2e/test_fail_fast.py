"""A bad setup of ``transactional run`` is one line on stderr and exit 2 within seconds,
before Spark's JVM starts: an unreachable ZooKeeper, Redis or Kafka, or an address where
a server of another of the three answers, a Delta or state directory that cannot be
written, a missing module, a bad setting. No library warning
(kazoo's retries, librdkafka's), no traceback, nothing created."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.test_cli import cli, env
from transactional.testing.servers import RedisServer, ZooKeeperServer, free_port

pytestmark = pytest.mark.e2e

#: What a check of these may take, at most: a JVM's start alone takes longer here.
WITHIN_S = 10.0


def closed_port() -> int:
    """A loopback port nothing listens on (free when asked)."""
    return free_port()


CASES = {
    "zookeeper": (
        "numbers",
        ["--zookeeper", "127.0.0.1:{port}"],
        {},
        "error: cannot reach ZooKeeper at 127.0.0.1:{port} (127.0.0.1:{port}: Connection "
        "refused): start the ZooKeeper servers there or fix --zookeeper",
    ),
    "redis": (
        "numbers",
        [],
        {"CLI_REDIS_URL": "redis://127.0.0.1:{port}/0"},
        "error: committer 'sink' (RedisCommitter): cannot reach Redis at "
        "redis://127.0.0.1:{port}/0 (Error 111 connecting to 127.0.0.1:{port}. Connection "
        "refused.): start redis-server there or fix the URL (host, port, database, password)",
    ),
    "kafka": (
        "numbers_from_kafka",
        [],
        {"CLI_KAFKA": "127.0.0.1:{port}", "CLI_KAFKA_TOPIC": "words"},
        "error: KafkaPartitionedSpout: cannot reach Kafka at 127.0.0.1:{port} (",
    ),
    "delta-path-is-a-file": (
        "numbers_in_delta",
        [],
        {"CLI_DELTA": "{tmp}/blocker/delta"},
        "error: committer 'sink' (DeltaCommitter): the Delta tables' directory "
        "{tmp}/blocker/delta cannot be a directory: {tmp}/blocker is a file; pass the path "
        "of a directory (it is created if missing)",
    ),
    "state-dir-is-a-file": (
        "numbers",
        ["--state-dir", "{tmp}/blocker/state"],
        {},
        "error: the state directory (--state-dir) {tmp}/blocker/state cannot be a "
        "directory: {tmp}/blocker is a file; pass the path of a directory (it is created "
        "if missing)",
    ),
    "missing-module": (
        None,
        [],
        {},
        "error: cannot import the topology module 'no_such_module': not found from ",
    ),
    "bad-setting": (
        "numbers",
        ["--zk-session-timeout", "0"],
        {},
        "error: setting zk_session_timeout='0' (from --zk-session-timeout): Input should be "
        "greater than 0",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_setup_is_one_line_and_exit_2_within_seconds(
    case: str, redis_url: str, tmp_path: Path
) -> None:
    factory, extra, more_env, expected = CASES[case]
    (tmp_path / "blocker").write_text("a file where a directory should be\n")
    port = closed_port()

    def filled(text: str) -> str:
        return text.format(port=port, tmp=tmp_path)

    state = tmp_path / "state"
    spec = f"tests.e2e.cli_topologies:{factory}" if factory else "no_such_module:build"
    args = ["run", spec, "--topology-id", "fast", "--state-dir", str(state), "--until-drained"]
    environ = env(redis_url, CLI_DELTA=str(tmp_path / "delta"))
    environ.update({k: filled(v) for k, v in more_env.items()})
    started = time.monotonic()
    done = cli(*args, *map(filled, extra), environ=environ, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(filled(expected)), lines[0]
    assert took < WITHIN_S, f"{case} took {took:.1f}s"
    assert done.stdout == ""
    assert not state.exists() and not (tmp_path / "delta").exists()  # nothing created


#: The issue's bound for an address where another server answers: kazoo and librdkafka
#: would retry it for their whole timeouts (33 s seen for ZooKeeper).
OTHER_PROTOCOL_WITHIN_S = 5.0

OTHER_PROTOCOL = {
    "zookeeper-at-redis": (
        "numbers",
        ["--zookeeper", "127.0.0.1:{redis}"],
        {},
        "error: no ZooKeeper server at 127.0.0.1:{redis} (127.0.0.1:{redis} speaks Redis, "
        "not ZooKeeper): fix --zookeeper (host:port[,host:port...][/chroot] of the ZooKeeper "
        "servers)",
    ),
    "redis-at-zookeeper": (
        "numbers",
        [],
        {"CLI_REDIS_URL": "redis://127.0.0.1:{zookeeper}/0"},
        "error: committer 'sink' (RedisCommitter): no Redis server at "
        "redis://127.0.0.1:{zookeeper}/0 (127.0.0.1:{zookeeper} speaks ZooKeeper, not Redis; "
        "Connection closed by server.): fix the URL (host, port, database, password)",
    ),
    "kafka-at-redis": (
        "numbers_from_kafka",
        [],
        {"CLI_KAFKA": "127.0.0.1:{redis}", "CLI_KAFKA_TOPIC": "words"},
        "error: KafkaPartitionedSpout: no Kafka broker at 127.0.0.1:{redis} (127.0.0.1:{redis} "
        "speaks Redis, not Kafka): fix bootstrap_servers (host:port of the brokers)",
    ),
    "kafka-at-zookeeper": (
        "numbers_from_kafka",
        [],
        {"CLI_KAFKA": "127.0.0.1:{zookeeper}", "CLI_KAFKA_TOPIC": "words"},
        "error: KafkaPartitionedSpout: no Kafka broker at 127.0.0.1:{zookeeper} "
        "(127.0.0.1:{zookeeper} speaks ZooKeeper, not Kafka): fix bootstrap_servers (host:port "
        "of the brokers)",
    ),
}


@pytest.mark.parametrize("case", sorted(OTHER_PROTOCOL))
def test_an_address_where_another_protocol_answers_is_one_line_and_exit_2_within_5s(
    case: str, redis_server: RedisServer, zookeeper_server: ZooKeeperServer, tmp_path: Path
) -> None:
    """Real servers of the other kinds answer on the ports given: each client's own
    retries would take their whole timeouts, the check at start one round trip or two."""
    factory, extra, more_env, expected = OTHER_PROTOCOL[case]

    def filled(text: str) -> str:
        return text.format(redis=redis_server.port, zookeeper=zookeeper_server.port)

    state = tmp_path / "state"
    args = ["run", f"tests.e2e.cli_topologies:{factory}", "--topology-id", "fast"]
    args += ["--state-dir", str(state), "--until-drained", *map(filled, extra)]
    environ = env(redis_server.url)
    environ.update({k: filled(v) for k, v in more_env.items()})
    started = time.monotonic()
    done = cli(*args, environ=environ, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [filled(expected)], done.stderr[-3000:]
    assert took < OTHER_PROTOCOL_WITHIN_S, f"{case} took {took:.1f}s"
    assert done.stdout == "" and not state.exists()
