"""The flags of ``transactional run`` that the runner itself acts on, on real runs: the
metrics server of ``--metrics-port``/``--metrics-host`` answers while the run lasts
with the run's own counts, ``--status-interval 0`` publishes no report, and
``--start-from`` starts a new topology where it says and is refused (exit 2, one
line, nothing changed) on a topology that has state. Each was parsed and then dropped
before (``tests/integration/test_cli_flags.py`` walks every flag to the runner)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
import redis

from tests.e2e.test_cli import CLI, ROOT, buckets, cli, env, held
from transactional.testing.servers import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # make test-slow: three whole runs


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            return str(reply.read().decode())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def committed_total(text: str, topology_id: str) -> float | None:
    prefix = f'transactional_txids_committed_total{{topology="{topology_id}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


def test_metrics_are_served_while_the_run_lasts_and_status_interval_0_reports_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    port = free_port()
    state = tmp_path / "state"
    args = ["run", "tests.e2e.cli_topologies:numbers", "--topology-id", "numbers"]
    args += ["--state-dir", str(state), "--master", "local[2]", "--batch-size", "100"]
    args += ["--metrics-port", str(port), "--metrics-host", "127.0.0.1", "--status-interval", "0"]
    # No --until-drained: the run keeps polling once 230 numbers (3 txids) are committed.
    runner = subprocess.Popen(
        [*CLI, *args],
        cwd=ROOT,
        env=env(redis_url, CLI_TOTAL="230"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        seen: float | None = None
        while time.monotonic() < deadline and runner.poll() is None:
            text = scrape(port)
            seen = committed_total(text, "numbers") if text else None
            if seen == 3:
                break
            time.sleep(0.2)
        assert seen == 3, f"metrics said {seen}; exit {runner.poll()}"
        assert held(redis_url) == buckets(230)
        # The marker key the docs document: <namespace>:txid, the last txid committed.
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        try:
            assert client.get("transactional:numbers:sink:txid") == "3"
        finally:
            client.close()
    finally:
        runner.send_signal(signal.SIGTERM)
        _out, err = runner.communicate(timeout=120)
    assert runner.returncode == 130, err[-3000:]
    assert scrape(port) is None  # the server went with the run
    status = cli("status", "--topology-id", "numbers", "--state-dir", str(state), "--json")
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert document["currtx"] == 4
    assert document["runner"] is None  # --status-interval 0: no report, not even at the end


CSV = "account,amount\nacct-a,1.500\nacct-b,2.250\nacct-a,4.000\nacct-c,8.125\n"


def balances(url: str) -> dict[str, Decimal]:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return {str(k): Decimal(v) for k, v in client.hgetall("balances").items()}
    finally:
        client.close()


def test_start_from_starts_a_new_topology_there_and_is_refused_once_it_has_state(
    redis_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    (source / "part-0.csv").write_text(CSV)
    lines = CSV.splitlines(keepends=True)
    start = len("".join(lines[:3]).encode())  # the byte where "acct-a,4.000" begins
    expected: Counter[str] = Counter()
    for line in lines[3:]:
        account, amount = line.strip().split(",")
        expected[account] += Decimal(amount)  # type: ignore[assignment]
    environ = env(
        redis_url,
        AMOUNTS_INPUT=str(source),
        AMOUNTS_REDIS_URL=redis_url,
        AMOUNTS_SINKS="redis",
        AMOUNTS_DELTA=str(tmp_path / "unused"),
    )
    common = ["tests.e2e.amounts:build", "--topology-id", "late", "--state-dir", str(tmp_path)]
    common += ["--master", "local[2]", "--until-drained"]
    first = cli("run", *common, "--start-from", f"part-0.csv={start}", environ=environ)
    assert first.returncode == 0, first.stderr[-3000:]
    assert balances(redis_url) == dict(expected)  # only what comes after the start

    again = cli("run", *common, "--start-from", "earliest", environ=environ)
    assert again.returncode == 2, again.stderr[-3000:]
    lines_out = again.stderr.strip().splitlines()
    assert len(lines_out) == 1 and lines_out[0].startswith("error: "), again.stderr
    assert "has already started" in lines_out[0] and "--start-from" in lines_out[0]
    assert balances(redis_url) == dict(expected)  # nothing changed
