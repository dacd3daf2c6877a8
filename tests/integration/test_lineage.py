"""OpenLineage run events (``RunnerConfig.lineage``) as a real HTTP endpoint the test
starts receives them from the OpenLineage client's HTTP transport (``OPENLINEAGE_URL``):
a START and a COMPLETE for each committed txid, naming the topology, the txid, the
files it read with the byte ranges it took (together every line of the input, once)
and the Redis keys it wrote; a FAIL for an attempt that failed, whose txid then
completes in another run; and with lineage off, OpenLineage is not even imported."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from pyspark.sql import functions as F

from committers import CounterTable, RedisCommitter
from coordinators import SQLiteStateStore
from tests.docs import example, run_shell
from tests.integration.topologies import BATCH, TOTAL
from tests.processes import redis_txid
from tests.reference import ORDERS, write_orders
from transactional import Bolt, RunnerConfig, TopologyBuilder, TransactionalRunner
from transactional.errors import InjectedFault
from transactional.faults import FaultPoint
from transactional.ledger import ID, folded
from transactional.sources.files import FilesPartitionedSpout
from transactional.types import TransactionAttempt

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = "orders-lineage"


class Collector(ThreadingHTTPServer):
    """An OpenLineage endpoint on a free loopback port: every event POSTed to it, kept."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.paths: list[str] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.paths.append(self.path)
                collector.events.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


class SumByShop(Bolt):
    outputs = ("default", "dead_letters")
    accounts = True

    def process(self, attempt: TransactionAttempt, batch: Any) -> Any:
        ok = F.col("error").isNull()
        return {
            "default": batch.where(ok)
            .groupBy("shop")
            .agg(F.sum("amount").alias("count"), *folded()),
            "dead_letters": batch.where(~ok).select("raw", F.col("error").alias("reason"), ID),
        }


class FailOnce:
    """The first attempt of ``txid`` fails once processed, as a bolt's error would."""

    def __init__(self, txid: int) -> None:
        self.txid = txid
        self.fired = 0

    def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        if point is FaultPoint.PROCESS and attempt.txid == self.txid and number == 1:
            self.fired += 1
            raise InjectedFault(f"lineage test: txid {self.txid} fails once")


def test_each_committed_txid_is_one_run_that_names_its_input_positions_and_outputs(
    spark: Any, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    collector: Collector,
) -> None:  # fmt: skip
    monkeypatch.setenv("OPENLINEAGE_URL", collector.url)
    monkeypatch.setenv("OPENLINEAGE_NAMESPACE", "tests")
    orders = write_orders(tmp_path / "orders")
    spout = FilesPartitionedSpout(
        orders, format="csv", schema="shop STRING, amount LONG", header=True, batch_size=2
    )
    sink = RedisCommitter(
        redis_url, {"totals": CounterTable("totals", ("shop",))}, dead_letters="bad"
    )
    topology = (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("sum", SumByShop())
        .set_committer("sink", sink, inputs={"totals": "sum:default", "bad": "sum:dead_letters"})
        .build()
    )
    faults = FailOnce(txid=2)
    # One txid at a time: no txid in flight beside the one that fails, to be cancelled.
    config = RunnerConfig(topology_id=TOPOLOGY, lineage=True, max_pending=1, backoff_initial_s=0.05)
    store = SQLiteStateStore(tmp_path / "state.db")
    TransactionalRunner(topology, store, spark, config, faults=faults).run(until_drained=True)
    assert faults.fired == 1

    committed = redis_txid(redis_url, "sink", TOPOLOGY)  # what the sink itself holds
    events = collector.events
    assert set(collector.paths) == {"/api/v1/lineage"}
    by_state: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_state.setdefault(event["eventType"], []).append(event)
    txids = {
        s: sorted(e["run"]["facets"]["transactional"]["txid"] for e in v)
        for s, v in by_state.items()
    }
    assert txids == {
        "START": sorted([*range(1, committed + 1), 2]),  # txid 2 started twice
        "COMPLETE": list(range(1, committed + 1)),
        "FAIL": [2],
    }
    (failed,) = by_state["FAIL"]
    assert (
        "InjectedFault: lineage test: txid 2 fails once"
        in failed["run"]["facets"]["errorMessage"]["message"]
    )
    # Each run is one attempt: a START and its end share a run id, and no other does.
    runs: dict[str, list[str]] = {}
    for event in events:
        runs.setdefault(event["run"]["runId"], []).append(event["eventType"])
    assert sorted(map(tuple, runs.values())) == sorted(
        [("START", "COMPLETE")] * committed + [("START", "FAIL")]
    )

    server = urlsplit(redis_url)
    where = f"redis://{server.hostname}:{server.port}/{server.path.strip('/') or '0'}"
    for event in by_state["COMPLETE"]:
        assert (event["job"]["namespace"], event["job"]["name"]) == ("tests", TOPOLOGY)
        assert [(o["namespace"], o["name"]) for o in event["outputs"]] == [
            (where, "totals"),
            (where, "dead_letters"),
        ]
        (source,) = event["inputs"]
        assert (source["namespace"], source["name"]) == ("file", str(orders.resolve()))
    # The byte ranges the COMPLETE events name: every data line of each file, once.
    ranges: dict[str, list[tuple[int, int, int]]] = {}
    for event in by_state["COMPLETE"]:
        positions = event["inputs"][0]["inputFacets"]["transactionalPositions"]["positions"]
        for part in positions["partitions"].values():
            ranges.setdefault(part["file"], []).append(
                (part["offset"], part["length"], part["count"])
            )
    for name, lines in ORDERS.items():
        taken = sorted(r for r in ranges[name] if r[2] > 0)
        start = len(lines[0]) + 1  # after the header
        assert taken[0][0] == start
        assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(taken))
        assert taken[-1][0] + taken[-1][1] == (orders / name).stat().st_size
        assert sum(r[2] for r in taken) == len(lines) - 1


PAGE = "docs/how-to/lineage.md"


def test_the_pages_install_names_extras_the_project_has() -> None:
    command = example(PAGE, "pip install", "sh").code.split("#")[0].split()
    extras = command[2].strip("'").removeprefix(".[").removesuffix("]").split(",")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert extras == ["spark", "delta", "lineage"]
    assert set(extras) <= set(declared["optional-dependencies"])


def test_the_pages_command_sends_a_complete_event_per_committed_txid(
    redis_url: str, tmp_path: Path, collector: Collector
) -> None:
    """The page's ``transactional run`` (its factory one of the tests', drained) with the
    client's endpoint in ``OPENLINEAGE_URL``: one COMPLETE per txid the sink holds."""
    env = {**os.environ, "OPENLINEAGE_URL": collector.url, "BUCKETS_REDIS_URL": redis_url}
    replace = {
        "my_module:build": "tests.integration.topologies:build_from_env",
        "--lineage": "--lineage --until-drained",
    }
    run_shell(example(PAGE, "--lineage", "sh"), tmp_path, replace, env)
    committed = redis_txid(redis_url, "sink", "orders")
    assert committed == TOTAL // BATCH
    complete = [e for e in collector.events if e["eventType"] == "COMPLETE"]
    assert sorted(e["run"]["facets"]["transactional"]["txid"] for e in complete) == list(
        range(1, committed + 1)
    )
    assert {(e["job"]["namespace"], e["job"]["name"]) for e in complete} == {("default", "orders")}


def test_lineage_off_imports_nothing_of_openlineage(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from transactional import RunnerConfig, TransactionalRunner\n"
        "import transactional.runner, transactional.runtime.executor\n"
        "assert RunnerConfig(topology_id='t').lineage is False\n"
        "print(sorted(m for m in sys.modules if m.startswith('openlineage')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert done.stdout.strip() == "[]"
