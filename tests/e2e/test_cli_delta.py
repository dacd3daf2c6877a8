"""``transactional run`` with a Delta committer: the issue's bug was a session without
Delta's settings ("'JavaPackage' object is not callable"). A factory that takes no
argument gets a session with its committers' ``spark_conf()``; one that takes the
session gets Delta's settings because delta-spark is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli import buckets, cli, currtx, env
from transactional.testing.servers import S3Server

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("factory", ["numbers_in_delta", "numbers_in_delta_given_spark"])
@pytest.mark.rotated
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
    # the table's creation, the run's claim of it with its fence token (an empty
    # write), then one Delta version per committed txid
    assert sorted((h["version"], h["operation"]) for h in history) == [
        (0, "CREATE TABLE"),
        (1, "WRITE"),
        (2, "MERGE"),
        (3, "MERGE"),
        (4, "MERGE"),
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


def test_run_status_query_and_rewind_on_tables_in_s3(s3_server: S3Server, tmp_path: Path) -> None:
    """The same topology with its table in a bucket of the S3 stand-in, everything
    reached through the standard AWS settings alone: ``run`` writes it (through
    delta-rs), ``status`` reads what the sink holds from its marker, ``query`` its
    values, ``rewind --to 1`` rolls it back to txid 1's counts (read here by
    ``deltalake``), and a rerun makes it whole again."""
    tables = f"s3://{s3_server.bucket()}/delta"
    environ = env("redis://unused", CLI_DELTA=tables, CLI_TOTAL="230", **s3_server.settings)
    state = str(tmp_path / "state")
    topology = ("tests.e2e.cli_topologies:numbers_in_delta", "--topology-id", "delta")

    def counts() -> dict[str, int]:
        from deltalake import DeltaTable

        table = DeltaTable(f"{tables}/buckets", storage_options=s3_server.settings)
        return {r["key"]: r["count"] for r in table.to_pyarrow_table().to_pylist()}

    run = ("run", *topology, "--state-dir", state, "--master", "local[1]", "--until-drained")
    done = cli(*run, "--batch-size", "100", environ=environ)
    assert done.returncode == 0, done.stderr[-3000:]
    assert counts() == buckets(230)
    shown = cli("status", *topology, "--state-dir", state, environ=environ)
    assert shown.returncode == 0, shown.stderr
    assert "  sink sink (DeltaCommitter): holds txid 3, as the store" in shown.stdout.splitlines()
    queried = cli("query", topology[0], "buckets", "k0", "k6", environ=environ)
    assert queried.returncode == 0, queried.stderr
    assert dict(line.split("\t") for line in queried.stdout.splitlines()) == {
        f'key="{k}"': str(buckets(230)[k]) for k in ("k0", "k6")
    }
    rewound = cli("rewind", *topology, "--state-dir", state, "--to", "1", environ=environ)
    assert rewound.returncode == 0, rewound.stderr[-3000:]
    assert counts() == buckets(100)
    again = cli(*run, "--batch-size", "100", environ=environ)
    assert again.returncode == 0, again.stderr[-3000:]
    assert counts() == buckets(230)
