"""pytest plugin (entry point ``pytest11``): fixtures for testing a topology.

- ``transactional_spark``: one local SparkSession for the test session (small, no UI).
  A project whose own conftest already makes a session with extra configuration
  (Delta) overrides this fixture to return that one, since Spark allows one session
  configuration per process.
- ``transactional_harness``: a factory, ``transactional_harness(build, **options)`` ->
  ``TopologyHarness`` with its SQLite store in the test's ``tmp_path``. Spark starts
  only if the harness needs it (no ``engine=`` given).
- ``transactional_faults``: the plan given with ``--transactional-faults PLAN``
  (grammar in ``transactional.testing.plan``), empty without the option.

Nothing heavy is imported until a fixture is used, so the plugin costs nothing at
collection.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from transactional.testing.harness import TopologyHarness
    from transactional.testing.plan import FaultPlan
    from transactional.topology import Topology

#: Small: test batches are small, and 200 shuffle partitions would be 200 tiny tasks.
SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("transactional", "transactional-spark testing")
    group.addoption(
        "--transactional-faults",
        default="",
        metavar="PLAN",
        help="fault plan for the transactional_faults fixture, "
        "e.g. 'after_sink_write:3:1,emit:7:*,crash@before_sink_write:5'",
    )


def pytest_configure(config: pytest.Config) -> None:
    text = config.getoption("--transactional-faults", default="")
    if text:  # a bad plan stops the session at once, not in every test that uses it
        _parse(text)


def _parse(text: str) -> FaultPlan:
    from transactional.testing.plan import FaultPlan, FaultPlanError

    try:
        return FaultPlan.parse(text)
    except FaultPlanError as exc:
        raise pytest.UsageError(f"--transactional-faults: {exc}") from None


@pytest.fixture(scope="session")
def transactional_spark() -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    from transactional.spark.session import create_spark_session

    owned = SparkSession.getActiveSession() is None
    session = create_spark_session("local[2]", "transactional-tests", SPARK_CONF)
    yield session
    if owned:
        session.stop()


@pytest.fixture
def transactional_faults(request: pytest.FixtureRequest) -> FaultPlan:
    """A new plan per test: crash rules are spent once they fire."""
    return _parse(request.config.getoption("--transactional-faults"))


@pytest.fixture
def transactional_harness(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Callable[..., TopologyHarness]:
    from transactional.testing.harness import TopologyHarness

    numbers = itertools.count(1)

    def make(
        build: Callable[[], Topology], *, topology_id: str = "test", **options: Any
    ) -> TopologyHarness:
        spark = None
        if options.get("engine") is None:
            spark = request.getfixturevalue("transactional_spark")
        options.setdefault("state_dir", tmp_path / f"harness-{next(numbers)}")
        return TopologyHarness(build, spark, topology_id=topology_id, **options)

    return make
