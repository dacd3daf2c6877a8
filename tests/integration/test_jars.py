"""Packages are resolved from Maven Central in a child process whose output goes to a log
file: one line on the terminal, the jars in place; a failure shows Ivy's reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

RESOLVE = "from transactional.jars import resolved_jars; import sys; resolved_jars([sys.argv[1]], sys.argv[2])"


def resolve(coordinate: str, ivy: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RESOLVE, coordinate, str(ivy)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_package_resolves_with_one_line_and_its_report_in_the_log(tmp_path: Path) -> None:
    done = resolve("org.slf4j:slf4j-api:2.0.13", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "resolving org.slf4j:slf4j-api:2.0.13 from https://repo1.maven.org/maven2/ "
        f"(first run; log: {tmp_path / 'resolve.log'})"
    ]
    assert (tmp_path / "jars" / "org.slf4j_slf4j-api-2.0.13.jar").stat().st_size > 10_000
    log = (tmp_path / "resolve.log").read_text()
    assert "org.slf4j#slf4j-api;2.0.13" in log and "resolution report" in log
    assert "repos.spark-packages.org" not in log  # Maven Central only: no unreachable hosts
    again = resolve("org.slf4j:slf4j-api:2.0.13", tmp_path)
    assert (again.returncode, again.stderr) == (0, "")  # resolved once: silent from then on


def test_a_failed_resolution_shows_why(tmp_path: Path) -> None:
    done = resolve("org.example.nowhere:no-such-artifact:0.0.1", tmp_path)
    assert done.returncode == 1
    message = done.stderr
    assert "could not resolve org.example.nowhere:no-such-artifact:0.0.1 from " in message
    assert "org.example.nowhere#no-such-artifact;0.0.1: not found" in message
    assert f"from {tmp_path / 'resolve.log'}:" in message
    assert not (tmp_path / "jars" / "org.example.nowhere_no-such-artifact-0.0.1.jar").exists()
