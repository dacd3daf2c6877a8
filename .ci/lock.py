"""Write ``constraints.txt``: the one set of versions CI, ``make test`` and ``make demo``
install, resolved by pip from ``pyproject.toml``'s ranges.

``make lock`` keeps every version the present file pins while it still fits the
ranges, and adds what a new requirement brings; ``make lock UPGRADE=1`` resolves the
newest versions the ranges allow (then run the suites, ``make test-bounds`` included,
before committing it). Two installs are resolved: the development one (PySpark with its
JVM, Delta, the tests' and the site's tools) and the Connect-only one (``pyspark-client``
and no PySpark), the second held to the first's versions, and both are written as one
file, since a constraint on a package a venv does not install is ignored.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints.txt"
PROJECT = "transactional-spark"
#: The installs the lock covers, each resolved as ``.[extras]``.
INSTALLS = ("spark,delta,lineage,dev,docs", "connect,dev")

HEADER = """\
# The one tested set of versions: CI, `make test`, `make demo` and `make docs` install
# with `pip install -c constraints.txt`, and so can you, for exactly what CI ran.
# pyproject.toml declares the ranges; this file is written by `make lock` (.ci/lock.py),
# never by hand. `make test-bounds` runs the suites' core at the ranges' lower ends.
"""


def normalized(name: str) -> str:
    """A distribution's name as pip compares names (PEP 503)."""
    return name.lower().replace("_", "-").replace(".", "-")


def read(path: Path) -> dict[str, str]:
    """``name==version`` lines of a constraints file, by normalized name."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[normalized(name)] = version.strip()
    return pins


def resolve(extras: str, held: dict[str, str]) -> dict[str, str]:
    """What pip would install for ``.[extras]`` on a bare venv, ``held`` as constraints."""
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "held.txt"
        constraints.write_text("".join(f"{name}=={v}\n" for name, v in sorted(held.items())))
        report = Path(tmp) / "report.json"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
             "--report", str(report), "-c", str(constraints), f"{ROOT}[{extras}]"],
            check=True,
        )  # fmt: skip
        installs = json.loads(report.read_text())["install"]
    resolved = {
        normalized(item["metadata"]["name"]): item["metadata"]["version"] for item in installs
    }
    resolved.pop(PROJECT, None)
    return resolved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make lock", description=__doc__.splitlines()[0])
    parser.add_argument("--upgrade", action="store_true", help="the newest versions allowed")
    parser.add_argument(
        "--seed", type=Path, help="a pip freeze to start from instead of constraints.txt"
    )
    args = parser.parse_args(argv)
    held: dict[str, str] = {}
    if not args.upgrade:
        source = args.seed or LOCK
        held = read(source) if source.exists() else {}
        held.pop(PROJECT, None)
    locked: dict[str, str] = {}
    for extras in INSTALLS:
        resolved = resolve(extras, {**held, **locked})
        locked.update(resolved)
    LOCK.write_text(HEADER + "".join(f"{name}=={v}\n" for name, v in sorted(locked.items())))
    changed = sorted(name for name, v in locked.items() if held.get(name) != v)
    print(f"{LOCK.name}: {len(locked)} pins, {len(changed)} new or changed: {', '.join(changed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
