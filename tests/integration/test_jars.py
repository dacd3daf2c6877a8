"""Packages are resolved from Maven Central in a child process whose output goes to a log
file: one line on the terminal, the jars in place; a failure shows Ivy's reason; a
session loads exactly the jars of the packages asked for, never a previous version's."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

RESOLVE = (
    "import json, sys\n"
    "from transactional.spark.jars import resolved_jars\n"
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
        f"resolving org.slf4j:slf4j-api:2.0.13 from {CENTRAL}: a one-time download that "
        f"may take a minute or two (log: {tmp_path / 'resolve.log'})"
    ]
    assert (tmp_path / "jars" / "org.slf4j_slf4j-api-2.0.13.jar").stat().st_size > 10_000
    log = (tmp_path / "resolve.log").read_text()
    assert "org.slf4j#slf4j-api;2.0.13" in log and "resolution report" in log
    assert "repos.spark-packages.org" not in log  # Maven Central only: no unreachable hosts
    again = finish(resolve("org.slf4j:slf4j-api:2.0.13", tmp_path))
    assert again == (0, jars, "")  # resolved once: silent from then on


# resolved_jars with the start of the resolution (its child process) marked on stderr,
# written to the file descriptor itself: a line printed before it but left in Python's
# buffer would come out after it.
RESOLVE_MARKED = (
    "import json, os, sys\n"
    "import transactional.spark.jars as jars\n"
    "real_run = jars.subprocess.run\n"
    "def run(*args, **kwargs):\n"
    "    os.write(2, b'<the resolution starts>\\n')\n"
    "    return real_run(*args, **kwargs)\n"
    "jars.subprocess.run = run\n"
    "found = jars.resolved_jars(sys.argv[1].split(','), sys.argv[2], sys.argv[3])\n"
    "print(json.dumps([str(jar) for jar in found]))\n"
)


def local_repository(root: Path) -> str:
    """A Maven repository on disk holding org.example.local:tiny:1.0 (a POM and a jar,
    no dependencies): a resolution without the network."""
    directory = root / "org" / "example" / "local" / "tiny" / "1.0"
    directory.mkdir(parents=True)
    (directory / "tiny-1.0.pom").write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>org.example.local</groupId><artifactId>tiny</artifactId>"
        "<version>1.0</version><packaging>jar</packaging></project>\n"
    )
    with zipfile.ZipFile(directory / "tiny-1.0.jar", "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    return root.as_uri() + "/"


def test_the_line_comes_before_the_resolution_starts_and_only_the_first_time(
    tmp_path: Path,
) -> None:
    repository = local_repository(tmp_path / "repository")
    ivy = tmp_path / "ivy"

    def resolve_marked() -> tuple[int, list[str], str]:
        return finish(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    RESOLVE_MARKED,
                    "org.example.local:tiny:1.0",
                    str(ivy),
                    repository,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )

    code, jars, err = resolve_marked()
    assert (code, jars) == (0, ["org.example.local_tiny-1.0.jar"]), err
    assert err.splitlines() == [
        f"resolving org.example.local:tiny:1.0 from {repository}: a one-time download that "
        f"may take a minute or two (log: {ivy / 'resolve.log'})",
        "<the resolution starts>",
    ]
    assert "org.example.local#tiny;1.0" in (ivy / "resolve.log").read_text()
    # Resolved: the second call neither resolves nor says anything.
    assert resolve_marked() == (0, jars, "")


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
