"""Every flag of ``transactional run`` reaches what it controls: the runner's config, the
state store, the Spark session, the fault plan, the batch sizing, ``run()`` itself.

The command runs in this process as a user runs it (``main([...])``, the factory
imported, the store built and checked against a real ZooKeeper or SQLite directory);
only the two things that would start Spark are replaced by recorders, so that what
``run`` hands them can be read back: ``create_spark_session`` and the runner. The
cases are walked from the parser itself, so a flag added without a case here fails
``test_every_flag_of_run_has_a_case``. That the runner honours what it is given (a
metrics server on ``metrics_port``, no reports at ``status_interval_s`` 0, a start
refused on a topology that has state) is shown on real runs in
``tests/e2e/test_cli_flags_e2e.py``."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from coordinators import SQLiteStateStore, ZooKeeperStateStore
from transactional import cli
from transactional.cli._parser import build_parser
from transactional.cli.logs import LIBRARY_LOGGERS
from transactional.cli.settings import BY_NAME, settings_of
from transactional.config import RunnerConfig
from transactional.faults import FaultPoint, KillAt
from transactional.flow import AdaptiveBatchSize, BatchSizeConfig
from transactional.runner import RunStats
from transactional.types import Guarantee

pytestmark = pytest.mark.integration

FACTORY = "tests.e2e.cli_topologies:numbers_in_delta"


@dataclass
class Recorded:
    """What ``transactional run`` handed to the session and the runner."""

    master: str = ""
    remote: str | None = None
    app: str = ""
    spark_conf: dict[str, str] = field(default_factory=dict)
    runner: dict[str, Any] = field(default_factory=dict)
    until_drained: bool | None = None


def run_cli(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str]
) -> Recorded:
    recorded = Recorded()

    def session(master: str, app: str, conf: dict[str, str], remote: str | None = None) -> object:
        recorded.master, recorded.app, recorded.spark_conf = master, app, dict(conf)
        recorded.remote = remote
        return object()

    class Runner:
        def __init__(self, topology: Any, store: Any, spark: Any, config: Any, **kw: Any):
            recorded.runner = {"topology": topology, "store": store, "config": config, **kw}
            self.stats = RunStats()

        def run(self, until_drained: bool = False) -> RunStats:
            recorded.until_drained = until_drained
            return self.stats

        def stop(self) -> None:
            pass

    for name in [n for n in os.environ if n.startswith("TRANSACTIONAL_")]:
        monkeypatch.delenv(name)
    for name, value in {"CLI_DELTA": str(tmp_path / "delta"), **env}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("transactional.spark.session.create_spark_session", session)
    monkeypatch.setattr("transactional.runner.TransactionalRunner", Runner)
    monkeypatch.chdir(tmp_path)
    code = cli.main(argv)
    assert code == 0
    return recorded


def config(r: Recorded) -> RunnerConfig:
    value = r.runner["config"]
    assert isinstance(value, RunnerConfig)
    return value


@dataclass(frozen=True)
class Case:
    """A flag, the arguments that give it, and what must hold of the recorded run."""

    args: tuple[str, ...]
    check: Callable[[Recorded, Path, str], object]
    env: dict[str, str] = field(default_factory=dict)


def recorded_as(get: Callable[[Recorded], object], value: object) -> Callable[..., None]:
    def check(r: Recorded, _tmp: Path, _zk: str) -> None:
        assert get(r) == value

    return check


def _store_sqlite(r: Recorded, tmp: Path, _zk: str) -> None:
    store = r.runner["store"]
    assert isinstance(store, SQLiteStateStore)
    assert Path(store.path).resolve() == tmp / "states" / "state.db"


def _store_zk(r: Recorded, _tmp: Path, zk: str) -> None:
    store = r.runner["store"]
    assert isinstance(store, ZooKeeperStateStore)
    assert (store.hosts, store.session_timeout) == (zk, 10.0)


def _zk_timeout(r: Recorded, _tmp: Path, zk: str) -> None:
    store = r.runner["store"]
    assert isinstance(store, ZooKeeperStateStore)
    assert (store.hosts, store.session_timeout) == (zk, 4.5)


def _crash(r: Recorded, _tmp: Path, _zk: str) -> None:
    faults = r.runner["faults"]
    assert isinstance(faults, KillAt)
    assert faults.targets == {(FaultPoint.EMIT, 3), (FaultPoint.AFTER_ADVANCE, 5)}


def _verbose(_r: Recorded, _tmp: Path, _zk: str) -> None:
    assert logging.getLogger().level == logging.INFO
    assert {logging.getLogger(n).level for n in LIBRARY_LOGGERS} == {logging.INFO}


def _config_file(r: Recorded, _tmp: Path, _zk: str) -> None:
    assert config(r).max_pending == 5
    assert r.master == "local[3]"


def _conf(r: Recorded, _tmp: Path, _zk: str) -> None:
    assert r.spark_conf["spark.sql.shuffle.partitions"] == "3"
    assert config(r).backoff_max_s == 2.5


#: A runner setting -> the text its flag is given (None: a switch) and the value that
#: must reach ``RunnerConfig``: none of them the default. Shared with the demo's test.
RUNNER_VALUES: dict[str, tuple[str | None, object]] = {
    "max_pending": ("3", 3),
    "max_group": ("2", 2),
    "group_wait_s": ("0.25", 0.25),
    "max_attempts": ("4", 4),
    "attempt_timeout_s": ("none", None),
    "backoff_initial_s": ("0.5", 0.5),
    "backoff_max_s": ("7", 7.0),
    "poll_interval_s": ("0.5", 0.5),
    "poll_max_s": ("9", 9.0),
    "check_determinism": (None, False),
    "leader_timeout_s": ("12", 12.0),
    "max_reelections": ("3", 3),
    "warm_up": (None, True),
    "status_interval_s": ("0", 0.0),
    "metrics_port": ("9464", 9464),
    "metrics_host": ("0.0.0.0", "0.0.0.0"),
    "lineage": (None, True),
    "start_from": ("latest", "latest"),
    "guarantee": ("at_least_once", Guarantee.AT_LEAST_ONCE),
    "ledger": (None, False),
    "ledger_strict": (None, True),
}


def runner_args(name: str) -> tuple[str, ...]:
    text = RUNNER_VALUES[name][0]
    flag = BY_NAME[name].flag
    return (flag,) if text is None else (flag, text)


def runner_field(name: str) -> Callable[[Recorded, Path, str], object]:
    value = RUNNER_VALUES[name][1]

    def check(r: Recorded, _tmp: Path, _zk: str) -> object:
        got = getattr(config(r), name)
        assert got == value, (name, got, value)
        assert got != RunnerConfig.model_fields[name].default  # the flag changed it
        return got

    return check


#: flag -> how a test gives it, and what it must change.
CASES: dict[str, Case] = {
    "--verbose": Case(("-v",), _verbose),
    "--config": Case(("--config", "run.toml"), _config_file),
    "--conf": Case(
        ("--conf", "spark.sql.shuffle.partitions=3", "--conf", "backoff_max_s=2.5"), _conf
    ),
    "--topology-id": Case((), recorded_as(lambda r: config(r).topology_id, "flags")),
    "--zookeeper": Case(("--zookeeper", "{zk}"), _store_zk),
    "--zk-session-timeout": Case(
        ("--zookeeper", "{zk}", "--zk-session-timeout", "4.5"), _zk_timeout
    ),
    "--state-dir": Case(("--state-dir", "states"), _store_sqlite),
    "--master": Case(("--master", "local[1]"), recorded_as(lambda r: r.master, "local[1]")),
    "--remote": Case(
        ("--remote", "sc://spark.example:15002"),
        recorded_as(lambda r: r.remote, "sc://spark.example:15002"),
    ),
    "--batch-size": Case(("--batch-size", "7"), recorded_as(lambda r: r.runner["batch_size"], 7)),
    "--target-latency": Case(
        ("--batch-size", "auto", "--target-latency", "4"),
        recorded_as(lambda r: r.runner["batch_size"].config.target_latency_s, 4.0),
    ),
    "--until-drained": Case(("--until-drained",), recorded_as(lambda r: r.until_drained, True)),
    "--crash-at": Case(("--crash-at", "emit:3,after_advance:5"), _crash),
    **{
        s.flag: Case(runner_args(s.name), runner_field(s.name))
        for s in settings_of("run")
        if s.runner
    },
    # A switch both ways (default None: only with --batch-size auto): its other half.
    "--no-warm-up": Case(("--no-warm-up",), recorded_as(lambda r: config(r).warm_up, False)),
}


def run_flags() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    return {
        flag
        for action in run._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
        for flag in action.option_strings
        if flag == max(action.option_strings, key=len) or flag.startswith("--")
    }


def test_every_flag_of_run_has_a_case() -> None:
    assert run_flags() == set(CASES)


@pytest.mark.parametrize("flag", sorted(CASES))
def test_a_flag_of_run_reaches_what_it_controls(
    flag: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, zk_hosts: str
) -> None:
    case = CASES[flag]
    (tmp_path / "run.toml").write_text('master = "local[3]"\n[runner]\nmax_pending = 5\n')
    args = [a.replace("{zk}", zk_hosts) for a in case.args]
    argv = ["run", FACTORY, "--topology-id", "flags", *args]
    recorded = run_cli(argv, monkeypatch, tmp_path, case.env)
    case.check(recorded, tmp_path, zk_hosts)


def test_without_flags_the_defaults_reach_the_runner(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The baseline the cases above differ from: every default as RunnerConfig says."""
    recorded = run_cli(["run", FACTORY, "--topology-id", "flags"], monkeypatch, tmp_path, {})
    assert config(recorded) == RunnerConfig(topology_id="flags")
    assert recorded.master == "local[*]"
    assert recorded.until_drained is False
    assert recorded.runner["faults"] is None and recorded.runner["batch_size"] is None
    store = recorded.runner["store"]
    assert isinstance(store, SQLiteStateStore)
    assert Path(store.path).resolve() == tmp_path / ".transactional" / "state.db"
    assert {logging.getLogger(n).level for n in LIBRARY_LOGGERS} == {logging.ERROR}


def test_batch_size_auto_is_the_adaptive_sizing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    argv = ["run", FACTORY, "--topology-id", "flags", "--batch-size", "auto"]
    recorded = run_cli(argv, monkeypatch, tmp_path, {})
    assert isinstance(recorded.runner["batch_size"], AdaptiveBatchSize)
    assert recorded.runner["batch_size"].config == BatchSizeConfig()  # a 10 s target


def test_a_mistyped_flag_is_one_line_from_the_real_command(tmp_path: Path) -> None:
    """``python -m transactional.cli`` as a user runs it: the typo named with the flag it
    most likely meant, exit 2, before anything is imported or started."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSACTIONAL_")}
    argv = ["run", FACTORY, "--topology-id", "flags", "--max-pendng", "2"]
    done = subprocess.run(
        [sys.executable, "-m", "transactional.cli", *argv],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        "transactional run: error: unknown flag --max-pendng: did you mean --max-pending? "
        "(`transactional run --help` lists its flags)\n",
    )
    assert list(tmp_path.iterdir()) == []


def test_transactional_remote_reaches_the_session_as_remote_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = {"TRANSACTIONAL_REMOTE": "sc://spark.example:15002"}
    recorded = run_cli(["run", FACTORY, "--topology-id", "flags"], monkeypatch, tmp_path, env)
    assert recorded.remote == "sc://spark.example:15002"
    unset = run_cli(["run", FACTORY, "--topology-id", "flags"], monkeypatch, tmp_path, {})
    assert unset.remote is None


@pytest.mark.parametrize(
    ("env", "name", "value"),
    [
        ({"TRANSACTIONAL_METRICS_PORT": "9465"}, "metrics_port", 9465),
        ({"TRANSACTIONAL_STATUS_INTERVAL_S": "0.5"}, "status_interval_s", 0.5),
        ({"TRANSACTIONAL_START_FROM": "earliest"}, "start_from", "earliest"),
        ({"TRANSACTIONAL_GROUP_WAIT_S": "1"}, "group_wait_s", 1.0),
    ],
)
def test_the_environment_reaches_the_runner_as_the_flags_do(
    env: dict[str, str], name: str, value: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    recorded = run_cli(["run", FACTORY, "--topology-id", "flags"], monkeypatch, tmp_path, env)
    assert getattr(config(recorded), name) == value
