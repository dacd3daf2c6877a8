"""The ``my_topology.py`` of "Running a topology" (docs/how-to/run.md) runs as printed
with ``transactional run``, from a directory of its own and without PYTHONPATH: killed
at a crash point, run again, its Delta sums are exact against ``math.fsum``; ``status``
and ``list`` then show it."""

from __future__ import annotations

import json
import math
import random
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.docs import example, run_shell
from tests.e2e.test_cli import cli, env

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # make test-slow: a crash and a rerun
BATCH = 4


def docs_module() -> str:
    return example("docs/how-to/run.md", "# my_topology.py\n").code


def write_payments(directory: Path) -> tuple[dict[str, float], int]:
    """Three files of JSON lines; amounts are multiples of 1/8, so every partial sum is
    exact in a double whatever the order. Returns the sums and the longest file's size."""
    rng = random.Random(5)
    directory.mkdir()
    amounts: dict[str, list[float]] = defaultdict(list)
    longest = 0
    for p in range(3):
        lines = []
        for _ in range(rng.randint(7, 13)):
            account, amount = f"acct-{rng.randint(1, 5)}", rng.randint(-800, 8000) / 8
            amounts[account].append(amount)
            lines.append(json.dumps({"account": account, "amount": amount}))
        (directory / f"part-{p}.jsonl").write_text("\n".join(lines) + "\n")
        longest = max(longest, len(lines))
    return {a: math.fsum(v) for a, v in amounts.items()}, longest


def test_the_docs_module_runs_through_a_crash_and_is_exact(spark: Any, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_topology.py").write_text(docs_module())
    expected, longest = write_payments(tmp_path / "payments")
    environ = env(
        "redis://unused",
        PAYMENTS_INPUT=str(tmp_path / "payments"),
        PAYMENTS_DELTA=str(tmp_path / "delta"),
    )
    assert "PYTHONPATH" not in environ
    state = str(tmp_path / "state")
    args = [
        "run",
        "my_topology:build",
        "--topology-id",
        "payments",
        "--state-dir",
        state,
        "--master",
        "local[2]",
        "--until-drained",
        "--batch-size",
        str(BATCH),
        "--ledger-strict",  # the module's bolt accounts for its records: refused otherwise
    ]

    killed = cli(*args, "--crash-at", "after_sink_write:2", cwd=project, environ=environ)
    assert killed.returncode == -9, killed.stderr[-3000:]
    done = cli(*args, cwd=project, environ=environ)
    assert done.returncode == 0, done.stderr[-3000:]

    table = spark.read.format("delta").load(str(tmp_path / "delta" / "balances"))
    assert table.schema["count"].dataType.simpleString() == "double"  # a counter column
    assert {r["account"]: r["count"] for r in table.collect()} == expected

    txids = -(-longest // BATCH)  # every txid takes up to BATCH lines of each file
    status = cli("status", "--topology-id", "payments", "--state-dir", state, cwd=project)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0] == f"topology payments: currtx={txids + 1}"
    listed = cli("list", "--state-dir", state, cwd=project)
    assert (listed.returncode, listed.stdout) == (0, "payments\n")


def test_the_docs_commands_run_query_and_rewind_as_printed(tmp_path: Path) -> None:
    """The page's two command blocks, typed in the module's directory with its defaults
    (the input in ./payments, the tables in ./delta, the state in ./.transactional): the
    run's sums exact, ``status`` (also ``--json``, with the factory, and ``--watch``
    until Ctrl-C), ``query`` and ``list`` show them; then ``rewind`` and a rerun leave
    them exact again. The settings the page leaves to the environment come from it: 4
    lines a txid (so that there are txids to rewind over), and the rewind goes to txid 2
    where the page, written for a longer run, says 40."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_topology.py").write_text(docs_module())
    expected, longest = write_payments(project / "payments")
    txids = -(-longest // BATCH)
    assert txids > 2
    environ = env("redis://unused", TRANSACTIONAL_BATCH_SIZE=str(BATCH))

    def balances() -> dict[str, float]:
        rows = DeltaTable(str(project / "delta" / "balances")).to_pyarrow_table().to_pylist()
        return {r["account"]: r["count"] for r in rows}

    commands = example("docs/how-to/run.md", "transactional list", "sh")
    watch = {"--watch": "topology payments"}
    _ran, status, as_json, held, watched, queried, listed = run_shell(
        commands, project, env=environ, watching=watch
    )
    assert balances() == expected
    assert status.splitlines()[0] == f"topology payments: currtx={txids + 1}"
    assert json.loads(as_json)["currtx"] == txids + 1
    assert f"  sink sink (DeltaCommitter): holds txid {txids}, as the store" in held.splitlines()
    table = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", watched)  # the terminal's styles out
    assert re.search(rf"│ currtx +│ {txids + 1} ", table), table  # the live table's row
    shown = dict(line.split("\t") for line in queried.splitlines())
    assert {k: float(v) for k, v in shown.items()} == {
        f'account="{a}"': expected[a] for a in ("acct-1", "acct-2")
    }
    assert listed == "payments\n"

    rewound = example("docs/how-to/run.md", "transactional rewind", "sh")
    run_shell(rewound, project, replace={"--to 40": "--to 2"}, env=environ)
    assert balances() == expected
    again = run_shell(commands, project, env=environ, watching=watch)[1]
    assert again.splitlines()[0] == f"topology payments: currtx={txids + 1}"
