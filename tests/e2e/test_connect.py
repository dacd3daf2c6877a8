"""The demo on Spark Connect, as processes: a server started as the docs start one and
the docs' command against it; and a server restarted in the middle of a run, which the
run survives (its session reopened, the txids in flight replayed). Each judged record
by record against the input (``tests/history.py``, the tables read with ``deltalake``).
The crash matrix's Connect chains are in ``test_crash_matrix.py``."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pyspark
import pytest

from tests.docs import example
from tests.history import judge, read_delta
from tests.processes import ROOT, DemoProcess, demo_env, generated_tweets, store_state
from tests.reference import Expected
from transactional.testing.servers import SparkConnectServer, _wait_port, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

PAGE = "docs/how-to/connect.md"


@pytest.fixture(scope="module")
def tweets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected]:
    return generated_tweets(tmp_path_factory.mktemp("tweets"), 240, seed=41)


def failures(output: str) -> int:
    """The failed attempts the run reported in its last line."""
    found = re.findall(r"run_done .*?failures=(\d+)", output)
    assert found, output[-2000:]
    return int(found[-1])


def test_the_docs_server_and_demo_count_every_record_once(
    tweets: tuple[Path, Expected], tmp_path: Path
) -> None:
    """The page's server command (its port a free one, ``$SPARK_HOME`` PySpark's) and
    its demo command (its address that server's, the generated tweets for input)."""
    path, expected = tweets
    extra = example(PAGE, "pip install", "sh").code.split()[2].strip("'.[]")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert extra in pyproject["project"]["optional-dependencies"]
    port = free_port()
    server = example(PAGE, "SparkConnectServer", "sh").code.replace("15002", str(port))
    env = demo_env(SPARK_HOME=str(Path(pyspark.__file__).parent), PYSPARK_PYTHON=sys.executable)
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(
        ["bash", "-c", server], env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        _wait_port(port, proc, 300, "the docs' Spark Connect server")
        command = example(PAGE, "examples.tweets run", "sh").code.splitlines()[1]
        argv = shlex.split(command.replace("sc://spark.example:15002", f"sc://127.0.0.1:{port}"))
        assert argv[:3] == ["python", "-m", "examples.tweets"]
        state = tmp_path / "state"
        more = ["--input", str(path), "--state-dir", str(state), "--record-ids", "--top", "0"]
        run = DemoProcess([*argv[3:], *more], tmp_path / "demo.log", demo_env())
        assert run.wait() == 0, run.tail()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    verdict = judge(read_delta(state / "delta"), expected)
    assert verdict.exact, str(verdict)


def test_a_server_restarted_mid_run_is_survived_and_every_record_counted_once(
    tweets: tuple[Path, Expected], tmp_path: Path
) -> None:
    """SIGKILL the server once the run has committed two txids, start it again on its
    port: the run goes on (its attempts that met the restart fail and are replayed) and
    exits 0 with every record counted once."""
    from tests.jvm import driver_conf

    path, expected = tweets
    server = SparkConnectServer(conf=driver_conf(), python_path=str(ROOT))
    server.start()
    try:
        state = tmp_path / "state"
        args = [
            "run", "--input", str(path), "--spout", "opaque", "--sink", "delta",
            "--state-dir", str(state), "--batch-size", "10", "--max-pending", "2",
            "--until-drained", "--remote", server.remote, "--top", "0", "--record-ids",
        ]  # fmt: skip
        run = DemoProcess(args, tmp_path / "run.log", demo_env())
        deadline = time.monotonic() + 300
        while store_state(state)[0] < 3:
            assert run.proc.poll() is None, run.tail()
            assert time.monotonic() < deadline, "two txids not committed in 300 s"
            time.sleep(0.2)
        old = server.proc
        assert old is not None
        server.stop()
        assert old.returncode == -signal.SIGKILL  # the restart fired: the server died
        assert run.proc.poll() is None, run.tail()  # ...in the middle of the run
        server.start()
        assert server.proc is not None and server.proc.pid != old.pid
        assert run.wait() == 0, run.tail()
    finally:
        server.close()
    output = run.output()
    assert failures(output) >= 1, output[-3000:]  # what was in flight failed, replayed
    verdict = judge(read_delta(state / "delta"), expected)
    assert verdict.exact, str(verdict)
