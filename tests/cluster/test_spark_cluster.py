"""The tweet demo on a Spark standalone cluster (a master and two workers started from
the PySpark install, on loopback): every spout kind counts exactly with
``--master spark://...`` and configuration only (the executors' Python given with
``--conf spark.pyspark.python``, the driver bound to loopback); a worker SIGKILLed in
the middle of a txid, and another started, leaves the counts exact. Answers computed
from the input files (``tests.reference``)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.history import judge, read_delta, read_redis
from tests.jvm import worker_python
from tests.processes import DemoProcess, demo_env, generated_tweets, redis_txid
from tests.reference import Expected
from tests.witness import active_executors, master_apps, wait_executor_lost, waited
from transactional.testing.cluster_servers import SparkMaster, SparkWorker
from transactional.testing.servers import free_port

pytestmark = pytest.mark.cluster

#: Settings a cluster run needs and a local one does not: the executors' Python (the
#: workers' own ``python3`` has neither pyarrow nor this project), and the driver bound
#: to and advertised on loopback, where the test's workers are.
CLUSTER_CONF = [
    f"spark.pyspark.python={worker_python()}",
    "spark.driver.host=127.0.0.1",
    "spark.driver.bindAddress=127.0.0.1",
    "spark.executor.memory=1g",
    "spark.sql.shuffle.partitions=4",
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[SparkMaster, list[SparkWorker]]]:
    master = SparkMaster()
    master.start()
    workers = [SparkWorker(master), SparkWorker(master)]
    try:
        for worker in workers:
            worker.start()
        yield master, workers
    finally:
        for server in [*workers, master]:
            server.close()


@pytest.fixture(scope="module")
def tweets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected]:
    return generated_tweets(tmp_path_factory.mktemp("input"), count=600, seed=5)


def run_args(
    master: SparkMaster, path: Path, tmp_path: Path, spout: str, sink: list[str], ui_port: int = 0
) -> list[str]:
    """The demo's arguments; ``ui_port``: the driver's UI there (Spark's REST API)."""
    ui = [f"spark.ui.port={ui_port}", "spark.ui.enabled=true"] if ui_port else []
    conf = [item for setting in [*CLUSTER_CONF, *ui] for item in ("--conf", setting)]
    batch = "200" if spout == "transactional" else "60"
    return [
        "run",
        "--input", str(path),
        "--spout", spout,
        *sink,
        "--state-dir", str(tmp_path / "state"),
        "--batch-size", batch,
        "--until-drained",
        "--master", master.url,
        *conf,
        "--top", "0",
        "--record-ids",
    ]  # fmt: skip


@pytest.mark.rotated(slices=3)  # one spout kind a run (54 s each in CI): all in three runs
@pytest.mark.parametrize("spout", ["transactional", "partitioned", "opaque"])
def test_every_spout_kind_counts_exactly_on_the_cluster(
    cluster: tuple[SparkMaster, list[SparkWorker]],
    tweets: tuple[Path, Expected],
    tmp_path: Path,
    spout: str,
) -> None:
    master, _ = cluster
    path, expected = tweets
    sink = ["--sink", "delta", "--delta-path", str(tmp_path / "delta")]
    before = {app["id"] for app in master_apps(master.ui_port)}
    # A process of its own: this one's session is local.
    run = DemoProcess(run_args(master, path, tmp_path, spout, sink), tmp_path / "run.log")
    assert run.proc.wait(timeout=600) == 0, run.log.read_text()[-3000:]
    # It ran there: the master itself lists one application more, this run's, finished.
    new = [app for app in master_apps(master.ui_port) if app["id"] not in before]
    assert [(a["name"], a["state"]) for a in new] == [("tweets", "FINISHED")], new
    verdict = judge(read_delta(tmp_path / "delta"), expected)
    assert verdict.exact, str(verdict)


def test_a_worker_killed_mid_txid_leaves_the_counts_exact(
    redis_url: str,
    cluster: tuple[SparkMaster, list[SparkWorker]],
    tweets: tuple[Path, Expected],
    tmp_path: Path,
) -> None:
    master, workers = cluster
    path, expected = tweets
    sink = ["--sink", "redis", "--redis-url", redis_url]
    ui_port = free_port()
    args = run_args(master, path, tmp_path, "partitioned", sink, ui_port)
    args[args.index("--batch-size") + 1] = "20"  # many txids: the kill lands inside one
    run = DemoProcess(args, tmp_path / "run.log", demo_env(SPARK_LOCAL_IP="127.0.0.1"))
    deadline = time.monotonic() + 300
    while redis_txid(redis_url, "sink") < 2:
        assert run.proc.poll() is None, run.log.read_text()[-3000:]
        assert time.monotonic() < deadline, "nothing committed in time"
        time.sleep(0.05)
    # An executor on each worker (one core each), as the driver's REST API lists them.
    executors = waited(
        "an executor on each worker",
        lambda: found if len(found := active_executors(ui_port)) == 2 else None,
        60,
    )
    victim = workers[0]
    victim.close()  # SIGKILL: the worker and its executor, in the middle of a txid
    at_kill = redis_txid(redis_url, "sink")
    lost = wait_executor_lost(ui_port, executors, timeout=60)  # the driver saw it go
    replacement = SparkWorker(master)
    replacement.start()
    workers[0] = replacement
    assert run.proc.wait(timeout=600) == 0, run.log.read_text()[-3000:]
    assert lost["id"] in executors and not lost["isActive"], lost
    assert redis_txid(redis_url, "sink") > at_kill  # txids were still to come at the kill
    verdict = judge(read_redis(redis_url), expected)
    assert verdict.exact, str(verdict)


def test_a_master_whose_ui_port_was_taken_meanwhile_is_asked_where_it_bound() -> None:
    # Another process listens on the UI port drawn for the master (it answers nothing):
    # Spark binds the next port, and the master's status is read there.
    master = SparkMaster()
    asked = master.ui_port
    try:
        with socket.create_server(("127.0.0.1", asked)):
            master.start()
            assert master.ui_port != asked
            assert master.alive_workers() == set()  # the real master's page: no worker
    finally:
        master.close()
