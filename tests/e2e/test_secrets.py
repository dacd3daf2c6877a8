"""Runs that use secrets show them nowhere. A password-protected Redis (source and sink,
the password in the URL, read by Spark tasks too) and ZooKeeper digest credentials
(``TRANSACTIONAL_ZOOKEEPER_AUTH``): the demo and ``transactional run`` with debug logs,
injected failures and Spark's event log on (every job's description, every SQL plan,
every property), ``status`` (text and JSON, with the sinks read), ``query``, ``list``,
and runs refused for a wrong password. Every byte of that output is searched for both
passwords; and the commits still count exactly, so the search read real runs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import redis

from tests.conftest import REDIS_PASSWORD
from tests.history import assert_exact, read_redis
from tests.processes import ROOT, demo_env, generated_tweets
from transactional.testing.servers import RedisServer

pytestmark = pytest.mark.e2e

REDIS_SECRET = REDIS_PASSWORD
ZK_SECRET = "zk-Pw-c41e08"
SECRETS = (REDIS_SECRET, ZK_SECRET)


@pytest.fixture
def redis_url(guarded_redis: RedisServer) -> str:
    client = redis.Redis.from_url(guarded_redis.url)
    client.flushdb()
    client.close()
    return guarded_redis.url


def command(args: list[str], env: dict[str, str], log: Path) -> subprocess.CompletedProcess[str]:
    """Run ``args`` (a module and its arguments), keeping all it printed in ``log`` (not
    the arguments: they hold the Redis password, given as a user gives it)."""
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    log.write_text(f"{done.stdout}\n{done.stderr}")
    return done


def spark_logged(tmp_path: Path) -> list[str]:
    """Spark's event log on (into ``tmp_path / "events"``, uncompressed), as ``--conf``
    flags."""
    events = tmp_path / "events"
    events.mkdir(exist_ok=True)
    conf = ["spark.eventLog.enabled=true", f"spark.eventLog.dir=file://{events}"]
    conf.append("spark.eventLog.compress=false")  # searchable as text
    return [item for setting in conf for item in ("--conf", setting)]


def assert_no_secret(tmp_path: Path) -> None:
    """No file under ``tmp_path`` (outputs, logs, Spark's event logs, the stores' files)
    holds a password; and the event logs are there and hold the runs' jobs."""
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    events = [p for p in files if "events" in p.parts]
    assert events and any("txid=" in p.read_text(errors="replace") for p in events)
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, f"{secret!r} in {path}"


@pytest.mark.slow
def test_no_output_of_a_run_with_secrets_shows_them(
    redis_url: str, zk_hosts: str, tmp_path: Path
) -> None:
    path, expected = generated_tweets(tmp_path / "input", count=300, seed=21)
    env = demo_env(TRANSACTIONAL_ZOOKEEPER_AUTH=f"ops:{ZK_SECRET}")
    out = tmp_path / "out"
    out.mkdir()
    loaded = command(
        ["examples.tweets", "-vv", "load", "--input", str(path), "--redis-url", redis_url],
        env, out / "load.log",
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    run = [
        "examples.tweets", "-vv", "run", "--source", "redis", "--redis-url", redis_url,
        "--spout", "opaque", "--sink", "redis", "--zookeeper", zk_hosts,
        "--state-dir", str(tmp_path / "state"), "--batch-size", "10", "--until-drained",
        "--fail-rate", "0.3", "--fail-seed", "4", *spark_logged(tmp_path),
    ]  # fmt: skip
    done = command(run, env, out / "run.log")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "txid failed" in done.stderr  # the injected failures were logged, with errors
    assert_exact(read_redis(redis_url, inputs="tweets:*"), expected, ids=False)

    # The operator's commands on that topology.
    status = ["transactional.cli", "status", "--topology-id", "tweets", "--zookeeper", zk_hosts]
    shown = command(status, env, out / "status.log")
    assert shown.returncode == 0 and shown.stdout.startswith("topology tweets: currtx="), shown
    shown = command([*status, "--json"], env, out / "status.json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["topology_id"] == "tweets"
    listed = command(["transactional.cli", "list", "--zookeeper", zk_hosts], env, out / "list")
    assert listed.stdout == "tweets\n"

    # Refused: the wrong Redis password (the URL is in the error, masked), and no
    # ZooKeeper credentials for a topology protected by them.
    wrong = redis_url.replace(REDIS_SECRET, f"{REDIS_SECRET}x")
    at = run.index(redis_url)
    refused = command([*run[:at], wrong, *run[at + 1 :]], env, out / "wrong-redis.log")
    assert refused.returncode == 2 and "default:***@" in refused.stderr
    bare = {k: v for k, v in env.items() if k != "TRANSACTIONAL_ZOOKEEPER_AUTH"}
    refused = command(run, bare, out / "no-zk-auth.log")
    assert refused.returncode == 2 and "protected by a ZooKeeper ACL" in refused.stderr
    assert_no_secret(tmp_path)


def test_transactional_run_status_and_query_with_secrets_show_none(
    redis_url: str, zk_hosts: str, tmp_path: Path
) -> None:
    env = demo_env(
        TRANSACTIONAL_ZOOKEEPER_AUTH=f"ops:{ZK_SECRET}",
        CLI_REDIS_URL=redis_url,
        CLI_TOTAL="300",
        CLI_FAIL_TXID="3",
    )
    out = tmp_path / "out"
    out.mkdir()
    factory = "tests.e2e.cli_topologies:numbers"
    run = [
        "transactional.cli", "run", factory, "--topology-id", "numbers",
        "--zookeeper", zk_hosts, "--master", "local[2]", "--until-drained",
        "--max-attempts", "2", "-vv", *spark_logged(tmp_path),
    ]  # fmt: skip
    poisoned = command(run, env, out / "poisoned.log")
    assert poisoned.returncode == 1 and "cannot bucket txid 3" in poisoned.stderr
    del env["CLI_FAIL_TXID"]
    done = command(run, env, out / "run.log")
    assert done.returncode == 0, done.stderr[-3000:]
    want = Counter(f"k{n % 7}" for n in range(300))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert {k: int(v) for k, v in client.hgetall("buckets").items()} == want
    client.close()
    base = ["transactional.cli", "status", factory, "--topology-id", "numbers"]
    shown = command([*base, "--zookeeper", zk_hosts], env, out / "status.log")
    assert "  sink sink (RedisCommitter): holds txid 6, as the store" in shown.stdout, shown
    shown = command([*base, "--zookeeper", zk_hosts, "--json"], env, out / "status.json")
    assert json.loads(shown.stdout)["sinks"]["sink"]["txid"] == 6, shown
    query = ["transactional.cli", "query", factory, "buckets", "k0", "k1"]
    asked = command(query, env, out / "query.log")
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.splitlines() == [f'key="k0"\t{want["k0"]}', f'key="k1"\t{want["k1"]}']
    assert_no_secret(tmp_path)


def test_event_log_search_finds_a_secret_that_is_there(tmp_path: Path) -> None:
    """The search itself: a file holding a password is found."""
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "app").write_text("txid=1")
    (tmp_path / "leak.log").write_text(f"url=redis://:{REDIS_SECRET}@host")
    with pytest.raises(AssertionError, match=r"leak\.log"):
        assert_no_secret(tmp_path)
