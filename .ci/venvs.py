"""The installs beside the main one, each made afresh in a venv of its own, and the tests
run from it.

``lowest`` (``make test-bounds``): ``.venv-lowest``, the project with its ``spark``,
``delta``, ``lineage`` and ``dev`` extras, each of its own requirements (and its extras') at the lowest
version its range allows (``>=X`` taken as ``==X``), the tests' tools at the versions
``constraints.txt`` pins, and what those require as pip resolves it for a user. The
tests that cover what a dependency touches run from it: the unit tests, both sinks'
contracts, the ledger, the state stores on ZooKeeper, the Kafka source, the lineage
events, the demo exact and a crash chain; ``--short`` (CI) fewer. The ranges' upper ends are
``constraints.txt``'s set, which every other suite runs.

``client`` (``make connect-client-test``): ``.venv-client``, the project with its
``connect`` extra (PySpark's Connect client alone, ``pyspark-client``: no JVM, no PySpark
distribution) and the tests' tools, at ``constraints.txt``'s versions. The Connect
suite's representative tests run from it with ``--connect``, against a server the main
``.venv``'s install starts (``TRANSACTIONAL_TEST_SERVER_PYTHON``), and the tests marked
``client_only``. CI runs those Connect tests from it alone: ``client --ignores`` prints
the options that leave them out of its ``make connect-test``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / ".ci"))
from lock import LOCK, PROJECT, normalized, read  # noqa: E402

#: The extras of the lowest install, whose requirements are taken at their lower ends.
LOWEST_EXTRAS = ("spark", "delta", "lineage")
#: Run from the lowest venv: what each dependency's lower end could break.
LOWEST_TESTS = (
    "tests/unit",
    "tests/integration/test_committer_contract.py",  # Redis and Delta (delta-rs, delta-spark)
    "tests/integration/test_ledger.py",
    "tests/integration/test_state_stores.py",  # kazoo against ZooKeeper
    "tests/integration/test_kafka_source.py",  # confluent-kafka, the connector's jar
    "tests/integration/test_lineage.py",  # openlineage-python
    "tests/e2e/test_demo.py",
    # A crash chain on Delta: delta-rs and delta-spark at their lowest under SIGKILLs.
    "tests/e2e/test_crash_matrix.py::test_killed_at_every_step_then_rerun_counts_exactly"
    "[partitioned-delta]",
)
LOWEST_SHORT = (
    "tests/unit",
    "tests/integration/test_committer_contract.py",
    "tests/integration/test_ledger.py",
    "tests/integration/test_lineage.py",
    "tests/e2e/test_demo.py::test_a_killed_run_resumes_with_the_same_arguments_and_counts_exactly",
)
#: Run from the Connect-only venv, with --connect.
CLIENT_TESTS = (
    "tests/integration/test_committer_contract.py",
    "tests/integration/test_ledger.py",
    "tests/integration/test_user_topology.py",
    "tests/e2e/test_connect_client.py",
)
#: Of them, what only a Connect-only install runs (its tests are marked ``client_only``).
CLIENT_ONLY = ("tests/e2e/test_connect_client.py",)
SERVER_PYTHON = "TRANSACTIONAL_TEST_SERVER_PYTHON"


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def lowest() -> dict[str, str]:
    """The lowest version each of the project's runtime requirements allows, by name."""
    project = _project()
    extras = project["optional-dependencies"]
    lows: dict[str, str] = {}
    for line in [*project["dependencies"], *(r for e in LOWEST_EXTRAS for r in extras[e])]:
        requirement = Requirement(line)
        name = normalized(requirement.name)
        if name == PROJECT:
            continue
        floors = [s.version for s in requirement.specifier if s.operator in (">=", "==")]
        if len(floors) != 1:
            sys.exit(f"make test-bounds: {line!r} in pyproject.toml has no single lower bound")
        lows[name] = floors[0]
    return lows


def tools() -> dict[str, str]:
    """The tests' own tools (the ``dev`` extra) at the versions ``constraints.txt`` pins."""
    locked = read(LOCK)
    dev = _project()["optional-dependencies"]["dev"]
    return {name: locked[name] for name in (normalized(Requirement(line).name) for line in dev)}


def installed(python: Path) -> dict[str, str]:
    """What the venv of ``python`` holds, by normalized name."""
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return {normalized(n): v for n, _, v in (line.partition("==") for line in listed.split())}


def make(venv: Path, extras: str, pins: dict[str, str]) -> Path:
    """``venv`` made afresh, the project installed into it with ``extras`` under ``pins``
    (and the checkout on its path, as ``make venv`` installs it); its Python."""
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    constraints = venv / "constraints.txt"
    constraints.write_text("".join(f"{name}=={v}\n" for name, v in sorted(pins.items())))
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    subprocess.run([*pip, "--upgrade", "pip"], check=True, env=env)
    subprocess.run(
        [*pip, "-c", str(constraints), "--config-settings", "editable_mode=compat",
         "-e", f"{ROOT}[{extras}]"],
        check=True, env=env,
    )  # fmt: skip
    return python


def pytest(python: Path, tests: tuple[str, ...], more: list[str], **env: str) -> int:
    command = [str(python), "-m", "pytest", "-q", "-ra", "--durations=10",
               "-p", "no:cacheprovider", *tests, *more]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env={**os.environ, **env}).returncode


def run_lowest(short: bool, more: list[str]) -> int:
    lows = lowest()
    print("test-bounds: the lowest versions into .venv-lowest: "
          + ", ".join(f"{name} {v}" for name, v in sorted(lows.items())), flush=True)  # fmt: skip
    python = make(ROOT / ".venv-lowest", ",".join([*LOWEST_EXTRAS, "dev"]), {**tools(), **lows})
    held = installed(python)
    wrong = {
        name: held.get(name)
        for name, v in lows.items()
        if name not in held or Version(held[name]) != Version(v)
    }
    if wrong:
        sys.exit(f"test-bounds: not the lowest versions: {wrong} (wanted {lows})")
    return pytest(python, LOWEST_SHORT if short else LOWEST_TESTS, more)


def run_client(more: list[str]) -> int:
    python = make(ROOT / ".venv-client", "connect,dev", read(LOCK))
    held = installed(python)
    if "pyspark" in held or "pyspark-client" not in held:
        sys.exit(f"connect-client-test: .venv-client holds {held.get('pyspark')=} and "
                 f"{held.get('pyspark-client')=}: the Connect client alone was wanted")  # fmt: skip
    server = str(ROOT / ".venv" / "bin" / "python")
    return pytest(python, CLIENT_TESTS, ["--connect", *more], **{SERVER_PYTHON: server})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".ci/venvs.py", description=__doc__.splitlines()[0])
    parser.add_argument("install", choices=("lowest", "client"))
    parser.add_argument("--short", action="store_true", help="lowest: CI's shorter set")
    parser.add_argument(
        "--ignores",
        action="store_true",
        help="client: print the pytest options that leave out of a run from .venv what "
        "the Connect-only install runs (CI's make connect-test), and stop",
    )
    args, more = parser.parse_known_args(argv)  # the rest is pytest's
    if args.ignores:
        print(" ".join(f"--ignore={path}" for path in CLIENT_TESTS if path not in CLIENT_ONLY))
        return 0
    if args.install == "lowest":
        return run_lowest(args.short, more)
    return run_client(more)


if __name__ == "__main__":
    sys.exit(main())
