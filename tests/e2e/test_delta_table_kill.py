"""SIGKILL inside the Delta committer's multi-table commit (``tests/e2e/two_tables.py``):
the process dies after the first table of txid 2 took it and before the second did.
Each table is its own Delta commit, so the tables disagree until the rerun, which
skips txid 2 on the table that holds it, writes it on the other, and drains; every
count is then exact, against an answer computed here."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from committers.delta._committer import MAX_DRIVER_ROWS
from tests.jvm import short_lived

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # make test-slow: two Spark processes
ROOT = Path(__file__).resolve().parents[2]
TOTAL, BATCH = 200, 50  # four txids


def run(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **short_lived(os.environ),
        "TWO_TABLES_DELTA": str(tmp_path / "delta"),
        "TWO_TABLES_TOTAL": str(TOTAL),
        "TWO_TABLES_BATCH": str(BATCH),
        **extra,
    }
    args = ["--topology-id", "two", "--state-dir", str(tmp_path / "state")]
    args += ["--max-pending", "1", "--master", "local[2]", "--until-drained"]
    return subprocess.run(
        [sys.executable, "-m", "transactional.cli", "run", "tests.e2e.two_tables:build", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )


def markers(tmp_path: Path) -> dict[str, int | None]:
    return {
        table: DeltaTable(str(tmp_path / "delta" / table)).transaction_version(f"two:sink:{table}")
        for table in ("buckets", "parity")
    }


def counts(spark: Any, tmp_path: Path, table: str) -> dict[str, int]:
    rows = spark.read.format("delta").load(str(tmp_path / "delta" / table)).collect()
    return {row["key"]: row["count"] for row in rows}


@pytest.mark.parametrize(
    "driver_rows", [str(MAX_DRIVER_ROWS), "0"], ids=["delta-rs", "delta-spark"]
)
def test_a_kill_between_two_tables_of_one_delta_commit_is_repaired_exactly(
    spark: Any, tmp_path: Path, driver_rows: str
) -> None:
    killed = run(tmp_path, TWO_TABLES_KILL="2", TWO_TABLES_DRIVER_ROWS=driver_rows)
    output = killed.stdout + killed.stderr
    assert killed.returncode == -9, output[-3000:]  # died by SIGKILL, not by an error
    assert "killed_between_tables txid=2 after=buckets" in output, output[-3000:]
    assert markers(tmp_path) == {"buckets": 2, "parity": 1}  # the commit was half done

    rerun = run(tmp_path, TWO_TABLES_DRIVER_ROWS=driver_rows)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    assert markers(tmp_path) == {"buckets": 4, "parity": 4}
    assert counts(spark, tmp_path, "buckets") == dict(Counter(f"k{n % 7}" for n in range(TOTAL)))
    parity = Counter("even" if n % 2 == 0 else "odd" for n in range(TOTAL))
    assert counts(spark, tmp_path, "parity") == dict(parity)
