"""``transactional run`` with a Delta committer: the issue's bug was a session without
Delta's settings ("'JavaPackage' object is not callable"). A factory that takes no
argument gets a session with its committers' ``spark_conf()``; one that takes the
session gets Delta's settings because delta-spark is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli import buckets, cli, currtx, env

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("factory", ["numbers_in_delta", "numbers_in_delta_given_spark"])
def test_a_delta_topology_runs_and_its_table_is_exact(
    spark: Any, tmp_path: Path, factory: str
) -> None:
    delta = tmp_path / "delta"
    environ = env("redis://unused", CLI_DELTA=str(delta), CLI_TOTAL="230")
    done = cli(
        "run",
        f"tests.e2e.cli_topologies:{factory}",
        "--topology-id",
        "delta",
        "--state-dir",
        str(tmp_path / "state"),
        "--master",
        "local[2]",
        "--until-drained",
        "--batch-size",
        "100",
        environ=environ,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "committed 3 txids, 230 records, 0 failures"
    assert "Traceback" not in done.stderr
    assert currtx(tmp_path / "state", "delta") == 4

    table = spark.read.format("delta").load(str(delta / "buckets"))
    assert table.schema["count"].dataType.simpleString() == "bigint"
    assert {r["key"]: r["count"] for r in table.collect()} == buckets(230)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{delta / 'buckets'}`").collect()
    # the table's creation, then one Delta version per committed txid
    assert sorted((h["version"], h["operation"]) for h in history) == [
        (0, "CREATE TABLE"),
        (1, "MERGE"),
        (2, "MERGE"),
        (3, "MERGE"),
    ]

    # What the sink holds, read by `status` from the table's txid marker.
    shown = cli(
        "status",
        "tests.e2e.cli_topologies:numbers_in_delta",
        "--topology-id",
        "delta",
        "--state-dir",
        str(tmp_path / "state"),
        environ=environ,
    )
    assert shown.returncode == 0, shown.stderr
    assert "  sink sink (DeltaCommitter): holds txid 3, as the store" in shown.stdout.splitlines()
