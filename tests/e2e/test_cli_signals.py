"""Ctrl-C and SIGTERM where ``tests/e2e/test_cli.py`` does not send them: before the run
starts (while the factory builds) and to a standby waiting for the leadership, which
has started nothing and must leave at the first signal, not wait for the leader to end.
A running leader is interrupted in ``test_cli.py``."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests.e2e.test_cli import CLI, ROOT, buckets, currtx, env, held

pytestmark = pytest.mark.e2e


def wait_for(condition: Callable[[], bool], what: str, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 240
    while not condition():
        for proc in procs:
            assert proc.poll() is None, f"exited {proc.returncode} while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within 240 s"
        time.sleep(0.2)


def mentions(path: Path, text: str) -> Callable[[], bool]:
    return lambda: text in path.read_text()


def said(err: str) -> list[str]:
    """What the command said, without log lines (Spark's, and ours with -v)."""
    return [
        line
        for line in err.splitlines()
        if line.strip() and " level=" not in line and "WARN" not in line
    ]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_before_the_run_starts_exits_130_at_once(
    redis_url: str, tmp_path: Path, signum: int
) -> None:
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [
            *CLI,
            "run",
            "tests.e2e.cli_topologies:slow_to_build",
            "--topology-id",
            "numbers",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        cwd=ROOT,
        env=env(redis_url, CLI_READY=str(ready)),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(ready.exists, "factory call", [proc])
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)  # the factory sleeps 60 s
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert (out, err) == ("", "interrupted before the run started; nothing was committed\n")
    assert not (tmp_path / "state").exists()


def test_a_standby_leaves_at_the_first_signal_and_the_leader_goes_on(
    redis_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    args = [
        "run",
        "tests.e2e.cli_topologies:numbers",
        "--topology-id",
        "numbers",
        "--state-dir",
        str(state),
        "--master",
        "local[2]",
        "--batch-size",
        "50",
    ]
    environ = env(redis_url, CLI_TOTAL="300")  # 6 txids, then the leader polls
    leader = subprocess.Popen(
        [*CLI, *args],
        cwd=ROOT,
        env=environ,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    standbys: list[subprocess.Popen[str]] = []
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        wait_for(
            lambda: client.get("transactional:numbers:sink:txid") == "6", "sixth commit", [leader]
        )
        for signum in (signal.SIGTERM, signal.SIGINT):
            log = tmp_path / f"standby-{signum}.log"
            with log.open("w") as err_file:
                standby = subprocess.Popen(
                    [*CLI, "-v", *args],
                    cwd=ROOT,
                    env=environ,
                    text=True,
                    stdout=subprocess.PIPE,
                    stderr=err_file,
                )
            standbys.append(standby)
            # It logs this holding no leadership, which it cannot get while the leader
            # runs: a signal from here on finds it a standby.
            wait_for(mentions(log, "acquiring leadership"), "standby waiting", [leader, standby])
            standby.send_signal(signum)
            out, _ = standby.communicate(timeout=30)
            err = log.read_text()
            assert standby.returncode == 130, err[-3000:]
            assert said(err) == [
                f"interrupted ({signal.Signals(signum).name}) while waiting for the leadership "
                "of topology numbers: this runner started and committed nothing"
            ]
            assert out == "" and "Traceback" not in err
            assert leader.poll() is None  # the leader was not disturbed

        assert client.get("transactional:numbers:sink:txid") == "6"
        leader.send_signal(signal.SIGINT)
        out, err = leader.communicate(timeout=120)
    finally:
        for proc in (leader, *standbys):
            if proc.poll() is None:
                proc.kill()
        client.close()
    assert leader.returncode == 130, err[-3000:]
    assert said(err) == [
        "interrupted (SIGINT): committed 6 txids (last 6); txids in flight were abandoned and "
        "replay on the next run"
    ]
    assert held(redis_url) == buckets(300)
    assert currtx(state) == 7
