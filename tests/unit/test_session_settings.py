"""Which Spark settings a session gets: the local defaults (driver memory, few shuffle
partitions, no UI) on a local master only; on a cluster only the quiet defaults, and
the user's settings over everything."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlparse

import pytest

from transactional.spark.engine import FIRST_POOL
from transactional.spark.session import (
    DEFAULTS,
    LOCAL_DEFAULTS,
    LOG4J2,
    executor_python,
    is_local,
    session_settings,
)


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local[2,3]", True),
        ("spark://127.0.0.1:7077", False),
        ("yarn", False),
        ("k8s://https://host:443", False),
        ("localhost", False),
    ],
)
def test_local_masters_are_told_apart(master: str, local: bool) -> None:
    assert is_local(master) is local


def test_local_defaults_apply_to_a_local_master_only() -> None:
    local = session_settings("local[2]")
    assert local["spark.driver.memory"] == "2g" and local["spark.sql.shuffle.partitions"] == "4"
    assert local["spark.ui.enabled"] == "false"
    cluster = session_settings("spark://127.0.0.1:7077")
    assert not set(LOCAL_DEFAULTS) & set(cluster)
    assert {k: cluster[k] for k in DEFAULTS} == dict(DEFAULTS)


def test_a_local_jvm_runs_the_parallel_collector_and_a_users_options_replace_ours() -> None:
    java = "spark.driver.extraJavaOptions"
    local = session_settings("local[2]")[java].split()
    cluster = session_settings("spark://127.0.0.1:7077")[java].split()
    assert local == [f"-Dlog4j2.configurationFile={LOG4J2.as_uri()}", "-XX:+UseParallelGC"]
    assert cluster == [f"-Dlog4j2.configurationFile={LOG4J2.as_uri()}"]
    # The user's own options replace ours whole: with both, -XX:+UseG1GC beside
    # -XX:+UseParallelGC would stop the JVM at start ("multiple garbage collectors").
    mine = {java: "-XX:+UseG1GC -Dmy.flag=1"}
    assert session_settings("local[2]", mine)[java] == "-XX:+UseG1GC -Dmy.flag=1"


def test_the_users_settings_win_on_every_master() -> None:
    mine = {"spark.sql.shuffle.partitions": "64", "spark.pyspark.python": "/opt/py/bin/python"}
    for master in ("local[*]", "spark://10.0.0.1:7077"):
        settings = session_settings(master, mine)
        assert settings["spark.sql.shuffle.partitions"] == "64"
        assert settings["spark.pyspark.python"] == "/opt/py/bin/python"


def test_the_executors_python_comes_from_the_setting_on_every_master(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    given = {"spark.pyspark.python": "/opt/py/bin/python"}
    for master in ("local[2]", "spark://10.0.0.1:7077"):
        assert executor_python(master, session_settings(master, given)) == "/opt/py/bin/python"
    # Not given: this interpreter on a local master; on a cluster, left to the user's
    # environment (PYSPARK_PYTHON) or Spark's default.
    assert executor_python("local[*]", session_settings("local[*]")) == sys.executable
    assert executor_python("spark://10.0.0.1:7077", session_settings("spark://h:1")) is None
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3.11")
    assert executor_python("local[*]", session_settings("local[*]")) == "/usr/bin/python3.11"


@pytest.mark.parametrize("master", ["local[2]", "spark://127.0.0.1:7077"])
def test_every_master_runs_the_fair_scheduler_with_the_first_pool(master: str) -> None:
    """The pool file is the packaged one, given as a file URI (a bare path would be
    looked up on a cluster's default file system), and gives the engine's pool a
    minimum share above any machine's cores, so that it is always served first."""
    settings = session_settings(master)
    assert settings["spark.scheduler.mode"] == "FAIR"
    uri = urlparse(settings["spark.scheduler.allocation.file"])
    assert uri.scheme == "file"
    pools = {pool.get("name"): pool for pool in ET.parse(Path(uri.path)).getroot().iter("pool")}
    assert list(pools) == [FIRST_POOL]
    assert int(pools[FIRST_POOL].findtext("minShare", "0")) >= 100_000
    assert pools[FIRST_POOL].findtext("schedulingMode") == "FIFO"
