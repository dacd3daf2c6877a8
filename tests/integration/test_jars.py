"""Packages are resolved from Maven Central in a child process whose output goes to a log
file: one line on the terminal, the jars in place; a failure shows Ivy's reason; a
session loads exactly the jars of the packages asked for, never a previous version's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

RESOLVE = (
    "import json, sys\n"
    "from transactional.jars import resolved_jars\n"
    "jars = resolved_jars(sys.argv[1].split(','), sys.argv[2])\n"
    "print(json.dumps([str(jar) for jar in jars]))\n"
)
CENTRAL = "https://repo1.maven.org/maven2/"


def resolve(coordinates: str, ivy: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", RESOLVE, coordinates, str(ivy)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, list[str], str]:
    """Exit code, the jars it returned (file names), its stderr."""
    out, err = proc.communicate(timeout=300)
    jars = [Path(j).name for j in json.loads(out)] if proc.returncode == 0 else []
    return proc.returncode, jars, err


def test_a_package_resolves_with_one_line_and_its_report_in_the_log(tmp_path: Path) -> None:
    code, jars, err = finish(resolve("org.slf4j:slf4j-api:2.0.13", tmp_path))
    assert code == 0, err
    # slf4j-api has no dependencies (its POM on Maven Central): one jar, nothing else.
    assert jars == ["org.slf4j_slf4j-api-2.0.13.jar"]
    assert err.splitlines() == [
        f"resolving org.slf4j:slf4j-api:2.0.13 from {CENTRAL} "
        f"(first run; log: {tmp_path / 'resolve.log'})"
    ]
    assert (tmp_path / "jars" / "org.slf4j_slf4j-api-2.0.13.jar").stat().st_size > 10_000
    log = (tmp_path / "resolve.log").read_text()
    assert "org.slf4j#slf4j-api;2.0.13" in log and "resolution report" in log
    assert "repos.spark-packages.org" not in log  # Maven Central only: no unreachable hosts
    again = finish(resolve("org.slf4j:slf4j-api:2.0.13", tmp_path))
    assert again == (0, jars, "")  # resolved once: silent from then on


def test_an_upgrade_loads_the_new_version_only(tmp_path: Path) -> None:
    """The jars directory keeps the old version's jar after an upgrade; a session given
    both would have two versions of every class."""
    assert finish(resolve("org.slf4j:slf4j-api:2.0.12", tmp_path))[:2] == (
        0,
        ["org.slf4j_slf4j-api-2.0.12.jar"],
    )
    code, jars, err = finish(resolve("org.slf4j:slf4j-api:2.0.13", tmp_path))
    assert (code, jars) == (0, ["org.slf4j_slf4j-api-2.0.13.jar"]), err
    assert sorted(p.name for p in (tmp_path / "jars").iterdir()) == [
        "org.slf4j_slf4j-api-2.0.12.jar",
        "org.slf4j_slf4j-api-2.0.13.jar",
    ]
    # ...and each version, asked for again, is its own jar alone, without a resolution.
    assert finish(resolve("org.slf4j:slf4j-api:2.0.12", tmp_path)) == (
        0,
        ["org.slf4j_slf4j-api-2.0.12.jar"],
        "",
    )


def test_two_first_runs_at_once_resolve_once(tmp_path: Path) -> None:
    first, second = (resolve("org.slf4j:slf4j-api:2.0.13", tmp_path) for _ in range(2))
    results = [finish(first), finish(second)]
    assert [(code, jars) for code, jars, _ in results] == [
        (0, ["org.slf4j_slf4j-api-2.0.13.jar"]),
        (0, ["org.slf4j_slf4j-api-2.0.13.jar"]),
    ]
    lines = [line for _, _, err in results for line in err.splitlines()]
    assert len(lines) == 1 and lines[0].startswith("resolving org.slf4j:slf4j-api:2.0.13 ")


def test_a_failed_resolution_shows_why(tmp_path: Path) -> None:
    code, _, message = finish(resolve("org.example.nowhere:no-such-artifact:0.0.1", tmp_path))
    assert code == 1
    assert "could not resolve org.example.nowhere:no-such-artifact:0.0.1 from " in message
    assert "org.example.nowhere#no-such-artifact;0.0.1: not found" in message
    assert f"from {tmp_path / 'resolve.log'}:" in message
    assert not (tmp_path / "jars" / "org.example.nowhere_no-such-artifact-0.0.1.jar").exists()
    assert list((tmp_path / "resolved").iterdir()) == []  # nothing cached: next run retries


def test_a_coordinate_that_is_not_group_artifact_version_is_refused(tmp_path: Path) -> None:
    code, _, message = finish(resolve("io.delta:delta-spark", tmp_path))
    assert code == 1
    assert message.strip().splitlines()[-1] == (
        "transactional.errors.ConfigurationError: packages to resolve must be "
        "group:artifact:version, not ['io.delta:delta-spark']"
    )
    assert not tmp_path.joinpath("resolve.log").exists()  # refused before any resolution
