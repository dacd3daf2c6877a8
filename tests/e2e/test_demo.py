"""The tweet demo end to end, as a user runs it, with failures injected and processes
killed; every count is checked against an answer computed here from the input files."""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from examples.tweets.cli import main as demo
from tests.history import assert_exact, judge, read_delta, read_redis
from tests.jvm import short_lived
from tests.processes import run_summary
from tests.reference import Expected, expected_counts
from tests.runner_logs import FailedTxids

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
#: Records per txid: the transactional spout's batch is a total, the partitioned kinds'
#: is per partition (3 partitions), so each kind takes a few txids over the input.
BATCH = {"transactional": "120", "partitioned": "40", "opaque": "40"}


@pytest.fixture(scope="module")
def tweets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected]:
    out = tmp_path_factory.mktemp("input") / "tweets"
    code = demo(
        [
            "generate",
            "--count",
            "300",
            "--seed",
            "11",
            "--partitions",
            "3",
            "--bad-rate",
            "0.05",
            "--out",
            str(out),
        ],
        out=io.StringIO(),
    )
    assert code == 0
    expected = expected_counts(out)
    assert expected.dead_letters and expected.hashtags and expected.pairs
    return out, expected


def faulty_seed(txids: int, faults: int = 2) -> int:
    """A seed under which ``--fail-rate 0.2`` injects at least ``faults`` failures in the
    first attempts of the first ``txids`` txids, so every run below meets some."""
    from transactional.faults import RandomFaults

    return next(
        seed
        for seed in range(1000)
        if sum(RandomFaults(0.2, seed).planned(t, 1) is not None for t in range(1, txids + 1))
        >= faults
    )


@pytest.mark.parametrize("spout", ["transactional", "partitioned", "opaque"])
@pytest.mark.parametrize("sink", ["redis", "delta"])
@pytest.mark.rotated
def test_demo_with_injected_failures_counts_exactly(
    spark: Any,
    redis_url: str,
    tweets: tuple[Path, Expected],
    tmp_path: Path,
    sink: str,
    spout: str,
) -> None:
    path, expected = tweets
    seed = faulty_seed(txids=3)
    out = io.StringIO()
    target = (
        ["--redis-url", redis_url] if sink == "redis" else ["--delta-path", str(tmp_path / "delta")]
    )
    code = demo(
        [
            "run",
            "--input",
            str(path),
            "--spout",
            spout,
            "--sink",
            sink,
            *target,
            "--state-dir",
            str(tmp_path / "state"),
            "--batch-size",
            BATCH[spout],
            "--max-pending",
            "3",
            "--fail-rate",
            "0.2",
            "--fail-seed",
            str(seed),
            "--until-drained",
            "--master",
            "local[2]",
            "--record-ids",  # each tweet counted by id too: judged record by record
        ],
        out=out,
    )
    assert code == 0, out.getvalue()
    # Faults were injected (the seed plans some for this run's txids) and survived.
    assert run_summary(out.getvalue())["failures"] >= 1, out.getvalue()
    image = read_redis(redis_url) if sink == "redis" else read_delta(tmp_path / "delta")
    verdict = judge(image, expected)
    assert verdict.exact, str(verdict)


def test_demo_on_zookeeper_with_a_redis_source_and_sink(
    spark: Any, redis_url: str, zk_hosts: str, tweets: tuple[Path, Expected], tmp_path: Path
) -> None:
    path, expected = tweets
    assert demo(["load", "--input", str(path), "--redis-url", redis_url], out=io.StringIO()) == 0
    out = io.StringIO()
    failed = FailedTxids()  # the runner's own report of each failed attempt
    logging.getLogger("transactional.runner").addHandler(failed)
    try:
        code = run_zookeeper_demo(redis_url, zk_hosts, tmp_path, out)
    finally:
        logging.getLogger("transactional.runner").removeHandler(failed)
    assert code == 0, out.getvalue()
    # Exceptions were injected (the seed plans some for these txids) and survived.
    assert any("error=InjectedFault" in m for m in failed.messages), failed.messages
    verdict = judge(read_redis(redis_url, inputs="tweets:*"), expected)  # beside its queues
    assert verdict.exact, str(verdict)


def run_zookeeper_demo(redis_url: str, zk_hosts: str, tmp_path: Path, out: io.StringIO) -> int:
    return demo(
        [
            "run",
            "--source",
            "redis",
            "--redis-url",
            redis_url,
            "--spout",
            "partitioned",
            "--zookeeper",
            zk_hosts,
            "--sink",
            "redis",
            "--batch-size",
            "50",
            "--state-dir",
            str(tmp_path / "state"),
            "--fail-rate",
            "0.2",
            "--fail-seed",
            "3",
            "--until-drained",
            "--master",
            "local[2]",
            "--record-ids",
        ],
        out=out,
    )


def test_a_killed_run_resumes_with_the_same_arguments_and_counts_exactly(
    redis_url: str, tweets: tuple[Path, Expected], tmp_path: Path
) -> None:
    path, expected = tweets
    args = [
        sys.executable,
        "-m",
        "examples.tweets",
        "run",
        "--input",
        str(path),
        "--spout",
        "transactional",
        "--sink",
        "redis",
        "--redis-url",
        redis_url,
        "--state-dir",
        str(tmp_path / "state"),
        "--batch-size",
        "30",
        "--max-pending",
        "2",
        "--until-drained",
        "--master",
        "local[2]",
        "--top",
        "0",
        "--record-ids",  # judged record by record
    ]
    client = redis.Redis.from_url(redis_url)
    env = short_lived({**os.environ, "PYTHONPATH": str(ROOT)})
    log = (tmp_path / "first.log").open("wb")
    first = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 240
    while int(client.get("transactional:tweets:sink:txid") or 0) < 2:
        assert first.poll() is None, (tmp_path / "first.log").read_text()
        assert time.monotonic() < deadline, "the first run committed nothing in time"
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    killed_at = int(client.get("transactional:tweets:sink:txid") or 0)
    assert killed_at < -(-len(list_lines(path)) // 30)  # killed before the end

    second = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, timeout=600)
    assert second.returncode == 0, second.stderr.decode()[-3000:]
    assert_exact(read_redis(redis_url), expected, ids=True)


def list_lines(path: Path) -> list[bytes]:
    from tests.reference import input_files, lines_of

    return [line for file in input_files(path) for line in lines_of(file)]


def test_demo_with_adaptive_batch_size_counts_exactly(
    redis_url: str, tweets: tuple[Path, Expected], tmp_path: Path
) -> None:
    path, expected = tweets
    out = io.StringIO()
    code = demo(
        [
            "run",
            "--input",
            str(path),
            "--spout",
            "partitioned",
            "--sink",
            "redis",
            "--redis-url",
            redis_url,
            "--state-dir",
            str(tmp_path / "state"),
            "--batch-size",
            "auto",
            "--target-latency",
            "60",
            "--until-drained",
            "--master",
            "local[2]",
        ],
        out=out,
    )
    assert code == 0, out.getvalue()
    assert_exact(read_redis(redis_url), expected, ids=False)
    # 300 lines in 3 files of ~100: the first txid takes up to 1000 per partition
    assert "committed_txids=1 " in out.getvalue()
