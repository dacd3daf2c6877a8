"""What an install is told: the README's table of supported versions is pyproject.toml's
ranges, each with the two versions CI tests it at (its lower end, ``make test-bounds``,
and the one ``constraints.txt`` pins); every requirement of the project, its extras' but
the tools', is a range with both ends; and an install without PySpark is told which
extra brings it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
#: The extras a user installs; ``dev`` and ``docs`` are the repository's own tools.
USER_EXTRAS = ("spark", "delta", "connect", "lineage")
MARK = "<!-- versions:"


def locked() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name] = version
    return pins


def requirements() -> list[tuple[Requirement, str]]:
    """Each requirement a user's install may hold, with the extra that brings it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [(line, "") for line in project["dependencies"]]
    lines += [(line, e) for e in USER_EXTRAS for line in project["optional-dependencies"][e]]
    # An extra may bring another (delta: spark's): that one has its own row.
    return [(Requirement(r), e) for r, e in lines if Requirement(r).name != project["name"]]


def expected_rows() -> list[str]:
    pins = locked()
    rows = []
    for requirement, extra in requirements():
        specifiers = sorted(requirement.specifier, key=lambda s: s.operator != ">=")
        (low,) = [s.version for s in specifiers if s.operator == ">="]
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        label = f"{requirement.name} ({extra})" if extra else requirement.name
        ranges = ", ".join(str(s) for s in specifiers)
        rows.append(f"| {label} | {ranges} | {low} and {pins[name]} |")
    return rows


def test_every_requirement_is_a_range_with_a_lower_end_and_an_upper_one() -> None:
    for requirement, _ in requirements():
        operators = sorted(s.operator for s in requirement.specifier)
        assert operators in (["<", ">="], ["<=", ">="]), str(requirement)


def test_the_readme_names_each_range_and_the_versions_it_is_tested_at() -> None:
    text = (ROOT / "README.md").read_text()
    start = text.index(MARK)
    table = text[start:].split("\n\n", 1)[0].splitlines()
    assert table[1:3] == ["| requirement | range | tested at |", "|---|---|---|"]
    assert table[3:] == expected_rows()


def test_an_install_without_pyspark_is_told_which_extra_brings_it() -> None:
    script = (
        "import sys\nsys.modules['pyspark'] = None  # as if not installed\nimport transactional\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "ModuleNotFoundError: transactional-spark needs PySpark: install it with its `spark` "
        "extra (pip install 'transactional-spark[spark]': Spark in this process, and a Connect "
        "client too) or its `connect` extra (the Spark Connect client alone, no JVM)"
    )
