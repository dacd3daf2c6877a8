"""What an operator sees of a real run (Spark, Redis, both state stores): the status
document the runner publishes, read back from the store during and after the run, and
its Prometheus metrics scraped over HTTP while it runs; with an injected failure, both
show the retry and its cause. Expected figures come from the topology's own sizes
(``TOTAL`` records in txids of ``BATCH``), not from the code under test."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from coordinators import SQLiteStateStore, ZooKeeperStateStore
from tests.integration.topologies import BATCH, TOTAL, build, expected_counts
from transactional import RunnerConfig, TransactionalRunner
from transactional.errors import InjectedFault
from transactional.faults import FaultPoint

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Scraper:
    """The run's listener: at the second commit, scrape the metrics and read the
    store's status document, as an operator would from outside."""

    def __init__(self, port: int, read_status: Any) -> None:
        self.port = port
        self.read_status = read_status
        self.scraped = ""
        self.seen: Any = None
        self.commits = 0

    def on_commit(self, txid: int, records: int) -> None:
        self.commits += 1
        if self.commits == 2:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as answer:
                self.scraped = answer.read().decode()
            self.seen = self.read_status()


def _sample(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in {"topology": "ops", **labels}.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(
            f'{k}="{v}"' in line for k, v in {"topology": "ops", **labels}.items()
        ):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name}{{{wanted}}} in the scrape")


@pytest.mark.parametrize("store_kind", ["sqlite", "zookeeper"])
def test_status_and_metrics_show_the_run(
    spark: Any, redis_url: str, zk_hosts: str, tmp_path: Path, store_kind: str
) -> None:
    def store() -> Any:
        if store_kind == "sqlite":
            return SQLiteStateStore(tmp_path / "state.db")
        return ZooKeeperStateStore(zk_hosts)

    def read_status() -> Any:
        reader = store()
        reader.open("ops", read_only=True)
        try:
            return reader.read_status()
        finally:
            reader.close()

    port = _free_port()
    config = RunnerConfig(
        topology_id="ops",
        max_pending=1,
        status_interval_s=0.05,
        metrics_port=port,
        backoff_initial_s=0.05,
    )
    scraper = Scraper(port, read_status)
    faults = _FirstAttemptOf(3, FaultPoint.PROCESS)
    runner = TransactionalRunner(
        build(spark, redis_url), store(), spark, config, listener=scraper, faults=faults
    )
    stats = runner.run(until_drained=True)
    txids = TOTAL // BATCH
    assert stats.committed_txids == txids

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert {k: int(v) for k, v in client.hgetall("buckets").items()} == expected_counts()
    client.close()

    mid = scraper.seen  # after txid 1 committed, during txid 2's acknowledgement
    assert mid["running"] is True and mid["topology_id"] == "ops"
    assert mid["last_committed"] >= 1 and mid["leader"]["fence"] is not None
    assert _sample(scraper.scraped, "transactional_txids_committed_total") == 2
    assert _sample(scraper.scraped, "transactional_records_committed_total") == 2 * BATCH
    assert _sample(scraper.scraped, "transactional_commit_outcomes_total", outcome="applied") == 2

    final = read_status()
    assert (final["running"], final["in_flight"]) == (False, [])
    assert (final["last_committed"], final["committed_txids"]) == (txids, txids)
    assert (final["records"], final["records_total"], final["uncounted_txids"]) == (TOTAL, TOTAL, 0)
    assert (final["retries"], final["failures"]) == (1, {"InjectedFault": 1})
    assert final["last_error"]["txid"] == 3 and final["last_error"]["phase"] == "process"
    with pytest.raises(OSError):  # the server stopped with the run
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


class _FirstAttemptOf:
    """A fault at ``point`` in the first attempt of ``txid`` only."""

    def __init__(self, txid: int, point: FaultPoint) -> None:
        self.txid, self.point = txid, point

    def check(self, point: FaultPoint, attempt: Any, number: int) -> None:
        if attempt.txid == self.txid and number == 1 and point is self.point:
            raise InjectedFault(f"injected at {point.value} of txid {attempt.txid}")
