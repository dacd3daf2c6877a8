"""A user's topology with fractional sums (``tests/e2e/amounts.py``) through
``transactional run`` into Redis and Delta: killed at a crash point, run again, and
the sums are exact, against answers computed here with ``math.fsum`` and ``decimal``."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # make test-slow: a crash and a rerun
ROOT = Path(__file__).resolve().parents[2]


def write_input(directory: Path, seed: int = 11) -> list[tuple[str, Decimal]]:
    """Three partitions of ``account,amount`` lines; amounts are multiples of 1/8 (so
    binary doubles hold every partial sum exactly) with three decimals, some negative."""
    rng = random.Random(seed)
    directory.mkdir()
    rows: list[tuple[str, Decimal]] = []
    for p in range(3):
        lines = []
        for _ in range(rng.randint(9, 14)):
            account = f"acct-{rng.randint(1, 6)}"
            amount = Decimal(rng.randint(-4000, 40000)) / 8
            amount = amount.quantize(Decimal("0.001"))
            rows.append((account, amount))
            lines.append(f"{account},{amount}")
        (directory / f"part-{p}.csv").write_text("\n".join(lines) + "\n")
    return rows


def run(args: list[str], environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "transactional.cli", "run", "tests.e2e.amounts:build", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("crash", ["between_committers:2", "after_sink_write:3"])
def test_fractional_sums_are_exact_through_a_crash_and_a_rerun(
    spark: Any, redis_url: str, tmp_path: Path, crash: str
) -> None:
    rows = write_input(tmp_path / "input")
    doubles: dict[str, list[float]] = defaultdict(list)
    exact: dict[str, Decimal] = defaultdict(Decimal)
    for account, amount in rows:
        doubles[account].append(float(amount))
        exact[account] += amount
    expected_double = {a: math.fsum(v) for a, v in doubles.items()}

    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRANSACTIONAL_")},
        "AMOUNTS_INPUT": str(tmp_path / "input"),
        "AMOUNTS_REDIS_URL": redis_url,
        "AMOUNTS_DELTA": str(tmp_path / "delta"),
        "AMOUNTS_BATCH": "4",
    }
    args = [
        "--topology-id",
        "amounts",
        "--state-dir",
        str(tmp_path / "state"),
        "--master",
        "local[2]",
        "--until-drained",
    ]
    killed = run([*args, "--crash-at", crash], environ)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert f"crash_at point={crash.split(':')[0]} txid={crash.split(':')[1]}" in killed.stderr

    done = run(args, environ)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("committed ")

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    stored = {k: float(v) for k, v in client.hgetall("balances").items()}
    client.close()
    assert stored == expected_double  # exact equality: no value lost, none counted twice

    balances = spark.read.format("delta").load(str(tmp_path / "delta" / "balances"))
    assert balances.schema["count"].dataType.simpleString() == "double"
    assert {r["account"]: r["count"] for r in balances.collect()} == expected_double
    decimals = spark.read.format("delta").load(str(tmp_path / "delta" / "exact_balances"))
    assert decimals.schema["count"].dataType.simpleString() == "decimal(38,3)"
    assert {r["account"]: r["count"] for r in decimals.collect()} == dict(exact)
