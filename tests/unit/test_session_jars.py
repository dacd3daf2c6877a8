"""A session is given the jars its packages resolved to, less those Spark already holds
at the same or a later version (``session_jars``): Spark's class loaders ask Spark's own
jars first, so such a jar is never read, and every executor would copy it."""

from __future__ import annotations

from pathlib import Path

import pytest

from transactional.spark import jars

#: Spark's own jars, as a distribution names them: <artifact>-<version>.jar.
SPARK = [
    "jackson-databind-2.21.2.jar",
    "hadoop-client-api-3.5.0.jar",
    "zstd-jni-1.5.7-7.jar",
    "commons-pool-1.5.4.jar",
    "spark-sql-kafka-0-10_2.13-4.2.0.jar",
    "netty-codec-4.2.7.Final.jar",
    "slf4j-api-2.0.17.jar",
]


@pytest.fixture
def spark_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    for name in SPARK:
        (home / "jars" / name).touch()
    monkeypatch.setenv("SPARK_HOME", str(home))
    return home


def given(monkeypatch: pytest.MonkeyPatch, names: list[str]) -> list[str]:
    """The names ``session_jars`` keeps of ``names``, as Ivy retrieves them
    (<group>_<artifact>-<version>.jar)."""
    resolved = [Path("/ivy/jars") / name for name in names]
    monkeypatch.setattr(jars, "resolved_jars", lambda packages, ivy_dir, excludes=(): resolved)
    return [jar.name for jar in jars.session_jars(["g:a:1"])]


def test_a_jar_spark_holds_at_the_same_or_a_later_version_is_left_out(
    spark_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [
        "io.delta_delta-spark_4.2_2.13-4.4.0.jar",  # not Spark's: kept
        "com.fasterxml.jackson.core_jackson-databind-2.13.5.jar",  # Spark's is later
        "org.apache.hadoop_hadoop-client-api-3.5.0.jar",  # the same version
        "com.github.luben_zstd-jni-1.5.7-3.jar",  # a later build of the same release
        "org.apache.spark_spark-sql-kafka-0-10_2.13-4.2.0.jar",  # digits in its artifact
        "org.slf4j_slf4j-api-1.7.36.jar",
    ]
    assert given(monkeypatch, names) == ["io.delta_delta-spark_4.2_2.13-4.4.0.jar"]


def test_a_jar_spark_holds_older_or_whose_version_cannot_be_compared_is_kept(
    spark_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [
        "commons-pool_commons-pool-1.6.jar",  # Spark's 1.5.4 may lack its classes
        "io.netty_netty-codec-4.1.126.Final.jar",  # a version not of numbers only
        "org.apache.hadoop_hadoop-client-api-3.5.1.jar",  # a later patch than Spark's
        "org.example_jackson-databind-extra-2.13.5.jar",  # another artifact
    ]
    assert given(monkeypatch, names) == names


def test_without_spark_jars_to_compare_every_jar_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "nowhere"))
    names = ["com.fasterxml.jackson.core_jackson-databind-2.13.5.jar"]
    assert given(monkeypatch, names) == names
