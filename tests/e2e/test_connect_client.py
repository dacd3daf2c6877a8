"""From an install with PySpark's Connect client alone (the ``connect`` extra:
``pyspark-client``, no JVM, no PySpark distribution; ``make connect-client-test``): the
demo runs on the suite's Connect server and counts every tweet once, on Delta and on
Redis; a session in this process is refused at once, by the library and by the command
line, with what to install or give instead and no traceback."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from tests.history import judge, read_delta, read_redis
from tests.processes import ROOT, DemoProcess, demo_env, generated_tweets
from tests.reference import Expected
from transactional.errors import ConfigurationError
from transactional.testing.servers import SparkConnectServer

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.integration,
    pytest.mark.connect,
    pytest.mark.client_only,
]


@pytest.fixture(scope="module")
def tweets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected]:
    return generated_tweets(tmp_path_factory.mktemp("tweets"), 120, seed=57)


def test_the_install_holds_the_connect_client_and_no_pyspark_distribution() -> None:
    installed = {d.metadata["Name"].lower() for d in importlib.metadata.distributions()}
    assert (
        "pyspark-client" in installed
        and "pyspark" not in installed
        and "delta-spark" not in installed
    )


@pytest.mark.parametrize("sink", ["delta", "redis"])
def test_the_demo_counts_every_tweet_once_on_the_server(
    sink: str,
    spark_connect: SparkConnectServer,
    redis_url: str,
    tweets: tuple[Path, Expected],
    tmp_path: Path,
) -> None:
    path, expected = tweets
    state = tmp_path / "state"
    args = [
        "run", "--input", str(path), "--sink", sink, "--state-dir", str(state),
        "--batch-size", "30", "--until-drained", "--remote", spark_connect.remote,
        "--top", "0", "--record-ids",
    ]  # fmt: skip
    if sink == "redis":
        args += ["--redis-url", redis_url]
    run = DemoProcess(args, tmp_path / "run.log", demo_env())
    assert run.wait() == 0, run.tail()
    image = read_delta(state / "delta") if sink == "delta" else read_redis(redis_url)
    verdict = judge(image, expected)
    assert verdict.exact, str(verdict)


def test_a_session_in_this_process_is_refused_by_the_library() -> None:
    from transactional.spark.session import create_spark_session

    with pytest.raises(ConfigurationError, match=r"needs PySpark with its JVM .*\[spark\]"):
        create_spark_session("local[1]")


def test_a_session_in_this_process_is_refused_by_the_command_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.tweets", "run", "--state-dir", str(tmp_path),
         "--master", "local[1]", "--until-drained"],
        cwd=ROOT, env=demo_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "needs PySpark with its JVM" in done.stderr and "Traceback" not in done.stderr
