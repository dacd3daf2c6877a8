"""The pytest plugin of a planted run: ``pytest -p tests.mutation.plugin --plant NAME``
(or several, comma-separated) plants the bugs in the pytest process for the whole
session and names them to every demo process a test starts (``PLANTED``). With
``--plant-report FILE`` it writes there, as JSON, what caught them: the tests that
passed before the first failure (``passed``), and each failure (``failures``, in order:
the test, its first error line and whole text, and how many demo runs had started and
been killed by then, ``tests.processes.DEMO_RUNS``)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.mutation import PLANTED
from tests.mutation.bugs import planted
from tests.processes import DEMO_RUNS

_STACK = pytest.StashKey[contextlib.ExitStack]()
_CAUGHT = pytest.StashKey[dict[str, Any]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--plant", help="the planted bugs, comma-separated (tests.mutation.bugs)")
    parser.addoption("--plant-report", help="where to write what caught them (JSON)")


def pytest_configure(config: pytest.Config) -> None:
    names = config.getoption("plant")
    if not names:
        raise pytest.UsageError("tests.mutation.plugin needs --plant NAME[,NAME...]")
    stack = contextlib.ExitStack()
    stack.enter_context(planted(names))
    config.stash[_STACK] = stack
    config.stash[_CAUGHT] = {"bugs": names.split(","), "passed": [], "failures": []}
    os.environ[PLANTED] = names


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    caught = item.config.stash[_CAUGHT]
    if report.passed and report.when == "call" and not caught["failures"]:
        caught["passed"].append(item.nodeid)
    if report.failed:
        message = str(report.longrepr).strip().splitlines()
        caught["failures"].append(
            {
                "test": item.nodeid,
                "when": report.when,
                "runs": DEMO_RUNS["started"],
                "kills": DEMO_RUNS["killed"],
                "error": next((line for line in message if line.startswith("E ")), ""),
                "failure": "\n".join(message)[-20_000:],
            }
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    os.environ.pop(PLANTED, None)
    if _STACK in config.stash:
        config.stash[_STACK].close()
    path = config.getoption("plant_report")
    if path and _CAUGHT in config.stash:
        caught: dict[str, Any] = config.stash[_CAUGHT]
        caught["runs_total"] = DEMO_RUNS["started"]
        Path(path).write_text(json.dumps(caught, indent=1) + "\n", encoding="utf-8")
