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
from collections.abc import Callable
from pathlib import Path

import pyspark
import pytest

from tests.docs import example
from tests.history import judge, read_delta
from tests.processes import ROOT, DemoProcess, demo_env, generated_tweets, store_state
from tests.reference import Expected
from transactional.testing.servers import SparkConnectServer, _wait_port, free_port

# In ``make connect-test`` (``pytest --connect``), with the other Connect suites; each
# test starts a server of its own and runs its clients as processes.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.integration,
    pytest.mark.connect,
    pytest.mark.connect_only,
]

PAGE = "docs/how-to/connect.md"


@pytest.fixture(scope="module")
def tweets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected]:
    return generated_tweets(tmp_path_factory.mktemp("tweets"), 240, seed=41)


def failures(output: str) -> int:
    """The failed attempts the run reported in its last line."""
    found = re.findall(r"run_done .*?failures=(\d+)", output)
    assert found, output[-2000:]
    return int(found[-1])


def restart_at(
    server: SparkConnectServer,
    run: subprocess.Popen[bytes],
    txid: Callable[[], int],
    at_least: int,
    tail: Callable[[], str],
) -> int:
    """Once ``txid()`` is ``at_least`` (within 300 s, ``run`` alive throughout), SIGKILL
    the server and start it again on its port, ``run`` still alive; the txid seen."""
    deadline = time.monotonic() + 300
    while (seen := txid()) < at_least:
        assert run.poll() is None, tail()
        assert time.monotonic() < deadline, f"txid {at_least} not reached in 300 s"
        time.sleep(0.2)
    old = server.proc
    assert old is not None
    server.stop()
    assert old.returncode == -signal.SIGKILL  # the restart fired: the server died
    assert run.poll() is None, tail()  # ...in the middle of the run
    server.start()
    assert server.proc is not None and server.proc.pid != old.pid
    return seen


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
    from tests.jvm import driver_conf, short_lived_server

    path, expected = tweets
    server = short_lived_server(driver_conf())
    server.start()
    try:
        state = tmp_path / "state"
        args = [
            "run", "--input", str(path), "--spout", "opaque", "--sink", "delta",
            "--state-dir", str(state), "--batch-size", "10", "--max-pending", "2",
            "--until-drained", "--remote", server.remote, "--top", "0", "--record-ids",
        ]  # fmt: skip
        run = DemoProcess(args, tmp_path / "run.log", demo_env())
        restart_at(server, run.proc, lambda: store_state(state)[0], 3, run.tail)
        assert run.wait() == 0, run.tail()
    finally:
        server.close()
    output = run.output()
    assert failures(output) >= 1, output[-3000:]  # what was in flight failed, replayed
    verdict = judge(read_delta(state / "delta"), expected)
    assert verdict.exact, str(verdict)


def test_a_server_restart_is_survived_by_a_delta_committer_merging_on_the_server(
    tmp_path: Path,
) -> None:
    """The same restart on a run whose Delta committer has the server MERGE every txid
    (``max_driver_rows=0``, ``tests/e2e/two_tables.py``: two tables, each written
    through a session of its own that the restart closes as it closes the runner's):
    ``transactional run`` goes on, exits 0 on its own, and each table holds every
    number once, read with ``deltalake`` against counts made here; every txid's commit
    is delta-spark's MERGE, after the restart too (the Delta log's ``commitInfo``)."""
    from tests.jvm import driver_conf, short_lived_server

    total, batch = 600, 100  # 6 txids
    delta = tmp_path / "delta"
    env = {
        **demo_env(),
        "TWO_TABLES_DELTA": str(delta),
        "TWO_TABLES_TOTAL": str(total),
        "TWO_TABLES_BATCH": str(batch),
        "TWO_TABLES_DRIVER_ROWS": "0",
    }
    server = short_lived_server(driver_conf())
    server.start()
    log = tmp_path / "run.log"
    try:
        args = [
            "run", "tests.e2e.two_tables:build", "--topology-id", "two",
            "--state-dir", str(tmp_path / "state"), "--max-pending", "2",
            "--until-drained", "--remote", server.remote,
        ]  # fmt: skip
        with log.open("wb") as out:
            run = subprocess.Popen(
                [sys.executable, "-m", "transactional.cli", *args], cwd=ROOT, env=env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            restarted_at = restart_at(
                server, run, lambda: _marker(delta / "buckets"), 2,
                lambda: log.read_text()[-3000:],
            )  # fmt: skip
            # A process that hangs at its exit (a gRPC channel closed by the interpreter's
            # final collection) fails here.
            assert run.wait(timeout=300) == 0, log.read_text()[-3000:]
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    finally:
        server.close()
    output = log.read_text()
    done = re.findall(r"committed (\d+) txids, (\d+) records, (\d+) failures", output)
    assert done and int(done[-1][2]) >= 1, output[-3000:]  # in flight at the restart: replayed
    from collections import Counter

    from deltalake import DeltaTable

    expected = {
        "buckets": Counter(f"k{n % 7}" for n in range(total)),
        "parity": Counter("even" if n % 2 == 0 else "odd" for n in range(total)),
    }
    for table, counts in expected.items():
        rows = DeltaTable(str(delta / table)).to_pyarrow_table().to_pylist()
        assert {r["key"]: r["count"] for r in rows} == dict(counts), table
        assert len(rows) == len(counts), table  # no key twice
        # Every commit that carries the committer's marker (a txid, or the last of a
        # group of them) is a MERGE by delta-spark, up to the last txid, past the restart.
        merged = _merged_txids(delta / table)
        assert max(merged) == total // batch > restarted_at >= min(merged), (table, merged)
        assert all(engine.startswith("Apache-Spark") for engine in merged.values()), merged


#: A client that opens a session and a clone of it, says so, and stops both once told.
_STOPPER = """
import sys, time
from transactional.spark.connect import clone_session, connect_session, stop_session
spark = connect_session(sys.argv[1], "stopper")
clone = clone_session(spark, {"spark.sql.shuffle.partitions": "3"})
assert clone.conf.get("spark.sql.shuffle.partitions") == "3"
print("ready", flush=True)
sys.stdin.readline()
began = time.monotonic()
stop_session(clone)
stop_session(spark)
print(f"stopped in {time.monotonic() - began:.1f} s", flush=True)
"""


def test_sessions_whose_server_is_gone_are_stopped_without_waiting_for_it(tmp_path: Path) -> None:
    """``stop_session`` (a Delta committer's close, the process's exit) on sessions
    whose server was SIGKILLed: one try at releasing each, then done; PySpark's own
    ``stop()`` retries the release for ten minutes or more (its ``DefaultPolicy``)."""
    from tests.jvm import short_lived_server

    server = short_lived_server()
    server.start()
    errors = (tmp_path / "stderr").open("w")
    client = subprocess.Popen(
        [sys.executable, "-c", _STOPPER, server.remote], cwd=ROOT, env=demo_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
    )  # fmt: skip
    try:
        assert client.stdout is not None and client.stdin is not None
        assert client.stdout.readline() == "ready\n"
        old = server.proc
        server.stop()
        assert old is not None and old.returncode == -signal.SIGKILL  # the server is gone
        client.stdin.write("stop\n")
        client.stdin.flush()
        said, _ = client.communicate(timeout=120)
    finally:
        client.kill()
        server.close()
        errors.close()
    said += (tmp_path / "stderr").read_text()
    assert client.returncode == 0, said
    assert re.search(r"stopped in \d+\.\d s", said), said


def _marker(table: Path) -> int:
    """The txid marker the table holds (0: none yet, or no table yet)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        found = DeltaTable(str(table)).transaction_version(f"two:sink:{table.name}")
    except TableNotFoundError:
        return 0
    return found or 0


def _merged_txids(table: Path) -> dict[int, str]:
    """The commits to ``table`` that carry the committer's marker (its ``txn`` action),
    as the Delta log says: the marker's txid -> the engine that wrote it, or "not a
    MERGE" for a commit of another kind."""
    import json

    out = {}
    for entry in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in entry.read_text().splitlines() if line]
        txn = [
            a["txn"] for a in actions if a.get("txn", {}).get("appId") == f"two:sink:{table.name}"
        ]
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        if txn:
            merge = info.get("operation") == "MERGE"
            out[txn[0]["version"]] = info.get("engineInfo", "") if merge else "not a MERGE"
    return out
