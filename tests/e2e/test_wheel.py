"""The wheel as a data team installs it: built from this checkout, installed (not
editable) into a fresh venv that already holds the team's own pyarrow, pandas, pydantic
and redis, older than the ones CI runs, which the install must leave as they are. From
that venv, away from the checkout: ``transactional --help``, the README's topology
(summed exactly, judged against the orders' own text) and ``status`` on what it left;
the entry points resolve (the stores, the Spark settings, the pytest plugin), and the
wheel holds no top-level name but the project's three packages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.docs import example
from tests.reference import expected_orders, write_orders

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
#: A team's own versions, each the oldest the project's range allows or near it.
THEIRS = {"pyarrow": "21.0.0", "pandas": "2.2.3", "pydantic": "2.11.7", "redis": "6.4.0"}
#: What moves with them: pydantic's compiled core is pinned by pydantic itself.
WITH_THEIRS = {"pydantic-core"}
PACKAGES = {"transactional", "coordinators", "committers"}


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )  # fmt: skip
    assert done.returncode == 0, f"{argv[:3]} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done.stdout


def _installed(python: Path) -> dict[str, str]:
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    return {item["name"].lower().replace("_", "-"): item["version"] for item in json.loads(listed)}


def test_the_wheel_installs_beside_a_teams_versions_and_runs_the_readme(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SPARK", "PYSPARK"))}
    env["PYTHONWARNINGS"] = "ignore"
    # Built from a copy of the checkout's files (what git tracks or would), so that the
    # build leaves nothing in the checkout and takes nothing it ignores.
    source = tmp_path / "source"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)],
         tmp_path, env)  # fmt: skip
    (wheel,) = dist.glob("transactional_spark-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == PACKAGES

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q"]
    _run([*pip, *(f"{name}=={v}" for name, v in THEIRS.items())], tmp_path, env)
    theirs = {name: _installed(python)[name] for name in THEIRS}
    assert theirs == THEIRS
    # The rest as CI runs it (constraints.txt), but for what the team's versions pin.
    locked = [
        line
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
        and line.split("==")[0] not in {*THEIRS, *WITH_THEIRS}
    ]  # fmt: skip
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("\n".join([*locked, *(f"{n}=={v}" for n, v in THEIRS.items())]) + "\n")
    # The README's install lines: their extras, the first's installed from the wheel.
    lines = example("README.md", "pip install", "sh").code.splitlines()
    extras = [line.split("'")[1].removeprefix(".[").removesuffix("]") for line in lines]
    assert extras == ["spark,delta", "connect"]
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {"spark", "delta", "connect"} <= set(declared["optional-dependencies"])
    _run([*pip, "-c", str(constraints), f"{wheel}[{extras[0]}]"], tmp_path, env)
    after = _installed(python)
    assert {name: after[name] for name in THEIRS} == THEIRS  # left as they were
    assert "pyspark" in after and "delta-spark" in after

    work = tmp_path / "work"
    write_orders(work / "orders")
    script = work / "orders.py"
    script.write_text(example("README.md", "SumByShop").code)
    executable = venv / "bin" / "transactional"
    assert "run" in _run([str(executable), "--help"], work, env)
    _run([str(python), str(script)], work, env)

    totals, bad = expected_orders()
    rows = DeltaTable(str(work / "tables" / "totals")).to_pyarrow_table().to_pylist()
    assert {r["shop"]: r["count"] for r in rows} == totals and len(rows) == len(totals)
    letters = DeltaTable(str(work / "tables" / "dead_letters")).to_pyarrow_table().to_pylist()
    assert sorted(r["raw"] for r in letters) == sorted(bad)

    # status reads the store the README's topology used (.transactional/, the commands'
    # default), and its last committed txid is the one the table's own log records.
    status = json.loads(
        _run([str(executable), "status", "--topology-id", "orders", "--json"], work, env)
    )
    marker = DeltaTable(str(work / "tables" / "totals")).transaction_version("orders:sink:totals")
    assert marker is not None and marker >= 1
    assert (status["topology_id"], status["last_committed"]) == ("orders", marker)
    runner = status["runner"]
    assert (runner["running"], runner["last_committed"]) == (False, marker), runner

    # The pytest plugin is pytest's to load: with pytest beside it, as a team testing
    # its topology has it (the version CI runs).
    _run([*pip, "-c", str(constraints), "pytest"], tmp_path, env)
    loaded = _run(
        [str(python), "-c",
         "from importlib.metadata import entry_points\n"
         "for group in ('transactional.stores', 'transactional.spark_conf', 'pytest11'):\n"
         "    for point in entry_points(group=group):\n"
         "        if group != 'pytest11' or point.name == 'transactional':\n"
         "            print(group, point.name, point.load().__name__)\n"],
        work, env,
    )  # fmt: skip
    assert sorted(line.split()[:2] for line in loaded.splitlines()) == [
        ["pytest11", "transactional"],
        ["transactional.spark_conf", "delta"],
        ["transactional.stores", "sqlite"],
        ["transactional.stores", "zookeeper"],
    ]
