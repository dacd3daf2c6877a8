"""``transactional rewind`` on a user's topology (``tests/e2e/amounts.py``) over CSV files
into Delta: run to the end, rewind to txid 2 (the Delta tables hold what the first two
txids' records make, computed here), run again (they hold what every record makes, each
once); a rewind SIGKILLed after its sinks rolled back blocks runs until it is run again;
a topology with a Redis sink is refused with nothing changed."""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_user_amounts import Record, latest, run, write_input
from tests.jvm import short_lived

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # several runs of a topology
BATCH = 4


def cli(command: str, args: list[str], environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run(args, environ, command)


def through(partitions: list[list[Record]], txids: int) -> list[list[Record]]:
    """What the first ``txids`` txids read: ``BATCH`` records of each partition each."""
    return [records[: BATCH * txids] for records in partitions]


def expected(partitions: list[list[Record]]) -> dict[str, dict[str, Any]]:
    """The Delta tables' values per account, folded here from the records."""
    rows = [r for records in partitions for r in records if r is not None]
    doubles: dict[str, list[float]] = defaultdict(list)
    exact: dict[str, Decimal] = defaultdict(Decimal)
    counts: dict[str, int] = defaultdict(int)
    smallest: dict[str, Decimal] = {}
    for account, amount in rows:
        doubles[account].append(float(amount))
        exact[account] += amount
        counts[account] += 1
        smallest[account] = min(smallest.get(account, amount), amount)
    return {
        "balances": {a: math.fsum(v) for a, v in doubles.items()},
        "exact_balances": dict(exact),
        "records": dict(counts),
        "smallest": smallest,
        "latest": latest(partitions, BATCH),
    }


COLUMNS = {
    "balances": "count",
    "exact_balances": "count",
    "records": "count",
    "smallest": "min",
    "latest": "last",
}


def tables(spark: Any, delta: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for name, column in COLUMNS.items():
        frame = spark.read.format("delta").load(str(delta / name))
        out[name] = {r["account"]: r[column] for r in frame.collect()}
    return out


def currtx(state: Path) -> int:
    import sqlite3

    with sqlite3.connect(state / "state.db") as conn:
        (value,) = conn.execute("SELECT txid FROM currtx WHERE topology_id = 'amounts'").fetchone()
    return int(value)


def test_rewind_then_rerun_is_exact_and_a_killed_rewind_is_finished_by_running_it_again(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    partitions = write_input(tmp_path / "input", "csv", redis_url)
    txids = math.ceil(max(len(p) for p in partitions) / BATCH)
    assert txids >= 4
    environ = {
        **short_lived({k: v for k, v in os.environ.items() if not k.startswith("TRANSACTIONAL_")}),
        "AMOUNTS_INPUT": str(tmp_path / "input"),
        "AMOUNTS_REDIS_URL": redis_url,
        "AMOUNTS_DELTA": str(tmp_path / "delta"),
        "AMOUNTS_BATCH": str(BATCH),
        "AMOUNTS_SINKS": "delta",
    }
    store = ["--topology-id", "amounts", "--state-dir", str(tmp_path / "state")]
    running = [*store, "--master", "local[2]", "--until-drained", "--max-group", "1"]
    done = cli("run", running, environ)
    assert done.returncode == 0, done.stderr[-3000:]
    assert tables(spark, tmp_path / "delta") == expected(partitions)
    assert currtx(tmp_path / "state") == txids + 1

    # Redis cannot roll back: with a Redis sink the rewind is refused, nothing changed.
    refused = cli("rewind", [*store, "--to", "2"], {**environ, "AMOUNTS_SINKS": "redis,delta"})
    assert refused.returncode == 2
    assert "committer 'redis' (RedisCommitter) cannot roll Redis back to txid 2" in refused.stderr
    assert currtx(tmp_path / "state") == txids + 1
    assert tables(spark, tmp_path / "delta") == expected(partitions)

    back = cli("rewind", [*store, "--to", "2"], environ)
    assert back.returncode == 0, back.stderr[-3000:]
    assert "state store: currtx is 3" in back.stdout
    assert tables(spark, tmp_path / "delta") == expected(through(partitions, 2))
    assert currtx(tmp_path / "state") == 3

    again = cli("run", running, environ)
    assert again.returncode == 0, again.stderr[-3000:]
    assert tables(spark, tmp_path / "delta") == expected(partitions)

    # Killed after the sinks rolled back, before the store moved: runs are refused until
    # the rewind is run again, which finishes it.
    killed = cli("rewind", [*store, "--to", "1", "--crash-at", "sinks"], environ)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert tables(spark, tmp_path / "delta") == expected(through(partitions, 1))
    blocked = cli("run", running, environ)
    assert blocked.returncode == 2
    assert "being rewound to txid 1 and the rewind did not finish" in blocked.stderr
    status = cli("status", [*store, "--json"], environ)
    assert status.returncode == 0, status.stderr[-3000:]
    document = json.loads(status.stdout)
    assert document["rewinding"] == 1 and document["currtx"] == txids + 1
    assert document["rewind_targets"] == [0, *range(1, txids + 1)]
    finished = cli("rewind", [*store, "--to", "1"], environ)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "holds txid 1 already" in finished.stdout
    assert currtx(tmp_path / "state") == 2
    last = cli("run", running, environ)
    assert last.returncode == 0, last.stderr[-3000:]
    assert tables(spark, tmp_path / "delta") == expected(partitions)
