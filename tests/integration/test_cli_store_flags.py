"""Every flag of ``transactional status``, ``list``, ``rewind`` and ``query`` reaches what
it controls, on real state stores (SQLite, ZooKeeper): the store it opens (its
directory, hosts and session timeout, from flags, the environment or a run's config
file), the topology it looks at, how it prints, what it rolls back. The cases are
walked from the parser: a flag added without a case fails
``test_every_flag_has_a_case``. The commands run in this process as a user runs them
(``main([...])``); the stores they open are recorded as they are made, never replaced.
Flags shown on real runs elsewhere are named with the test that shows them."""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from coordinators import SQLiteStateStore, ZooKeeperStateStore
from transactional.cli import _commands, _status
from transactional.cli import _rewind as rewind_view
from transactional.cli._parser import build_parser
from transactional.cli.logs import LIBRARY_LOGGERS
from transactional.committer import Committer, Rollback
from transactional.store import StateStore, TopologyIdentity
from transactional.topology import Topology, TopologyBuilder
from transactional.types import CommitOutcome, TransactionAttempt

pytestmark = pytest.mark.integration


class Notebook(Committer):
    """A sink that rolls back by noting the txid in a file (``NOTEBOOK``): enough for
    ``rewind`` to reach the store; it never commits here."""

    path: Path | None = None

    def prepare(self, attempt: TransactionAttempt, inputs: Mapping[str, Any]) -> Any:
        raise AssertionError("not run here")

    def commit(self, attempt: TransactionAttempt, prepared: Any) -> CommitOutcome:
        raise AssertionError("not run here")

    def sink_marker(self, topology_id: str, name: str) -> int | None:
        return 2

    def rollback(self, topology_id: str, name: str, txid: int) -> Rollback:
        def apply() -> None:
            assert Notebook.path is not None
            Notebook.path.write_text(f"{topology_id} {name} {txid}\n")

        return Rollback([f"noted txid {txid}"], apply)


def rewindable() -> Topology:
    from tests.e2e.cli_topologies import Buckets, Numbers

    return (
        TopologyBuilder()
        .set_spout(Numbers(10))
        .set_bolt("bucket", Buckets(None))
        .set_committer("sink", Notebook(), "bucket")
        .build()
    )


FACTORY = f"{__name__}:rewindable"


def fill(store: StateStore, topology_id: str) -> None:
    """Two committed txids, the first kept for rewinds."""
    store.open(topology_id)
    try:
        store.register(TopologyIdentity("tests.e2e.cli_topologies.Numbers", "transactional"))
        store.acquire_leadership(timeout=30)
        for txid in (1, 2):
            store.start_transaction(txid, {"start": 5 * (txid - 1), "count": 5}, {})
            store.advance(txid)
    finally:
        store.close()


@dataclass
class World:
    tmp: Path
    zk: str
    opened: list[StateStore] = field(default_factory=list)
    out: str = ""


@pytest.fixture
def world(tmp_path: Path, zk_hosts: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """Topology ``sq`` in SQLite under ``tmp/state``, ``zk`` in ZooKeeper; a config file
    ``run.toml`` naming the ZooKeeper store; every store the commands make, recorded."""
    fill(SQLiteStateStore(tmp_path / "state" / "state.db"), "sq")
    fill(ZooKeeperStateStore(zk_hosts), "zk")
    (tmp_path / "run.toml").write_text(
        f'topology_id = "zk"\nzookeeper = "{zk_hosts}"\nzk_session_timeout = 7\n'
        "[runner]\nmax_pending = 3\n"
    )
    world = World(tmp_path, zk_hosts)
    real = _status.open_store

    def recording(*args: Any) -> StateStore:
        store = real(*args)
        world.opened.append(store)
        return store

    for module in (_commands, _status, rewind_view):
        monkeypatch.setattr(module, "open_store", recording)
    for name in ("TRANSACTIONAL_TOPOLOGY_ID", "TRANSACTIONAL_ZOOKEEPER", "TRANSACTIONAL_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    Notebook.path = tmp_path / "notebook"
    yield world


def main(world: World, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = _commands.main([a.replace("{zk}", world.zk) for a in argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def zk_store(world: World) -> ZooKeeperStateStore:
    stores = [s for s in world.opened if isinstance(s, ZooKeeperStateStore)]
    assert stores, world.opened
    return stores[-1]


def sqlite_store(world: World) -> SQLiteStateStore:
    stores = [s for s in world.opened if isinstance(s, SQLiteStateStore)]
    assert stores, world.opened
    return stores[-1]


Check = Callable[[World, "pytest.CaptureFixture[str]"], None]


def status_json(world: World, capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    return json.loads(main(world, capsys, "status", "--json", *argv))


def _status_state_dir(w: World, c: pytest.CaptureFixture[str]) -> None:
    doc = status_json(w, c, "--topology-id", "sq", "--state-dir", "state")
    assert (doc["topology_id"], doc["currtx"]) == ("sq", 3)
    assert Path(sqlite_store(w).path).resolve() == w.tmp / "state" / "state.db"


def _status_zookeeper(w: World, c: pytest.CaptureFixture[str]) -> None:
    doc = status_json(w, c, "--topology-id", "zk", "--zookeeper", "{zk}")
    assert (doc["topology_id"], doc["currtx"]) == ("zk", 3)
    assert (zk_store(w).hosts, zk_store(w).session_timeout) == (w.zk, 10.0)


def _status_session_timeout(w: World, c: pytest.CaptureFixture[str]) -> None:
    status_json(w, c, "--topology-id", "zk", "--zookeeper", "{zk}", "--zk-session-timeout", "4")
    assert zk_store(w).session_timeout == 4.0


def _status_config(w: World, c: pytest.CaptureFixture[str]) -> None:
    doc = status_json(w, c, "--config", "run.toml")  # topology id and store from the file
    assert (doc["topology_id"], doc["currtx"]) == ("zk", 3)
    assert (zk_store(w).hosts, zk_store(w).session_timeout) == (w.zk, 7.0)


def _status_topology_id(w: World, c: pytest.CaptureFixture[str]) -> None:
    assert status_json(w, c, "--state-dir", "state", "--topology-id", "sq")["topology_id"] == "sq"


def _status_json(w: World, c: pytest.CaptureFixture[str]) -> None:
    plain = main(w, c, "status", "--topology-id", "sq", "--state-dir", "state")
    assert plain.startswith("topology sq: currtx=3\n")
    doc = status_json(w, c, "--topology-id", "sq", "--state-dir", "state")
    assert sorted(doc["stored"]) == ["1", "2"] and doc["rewind_targets"] == [0, 1, 2]


def _status_factory(w: World, c: pytest.CaptureFixture[str]) -> None:
    doc = status_json(w, c, FACTORY, "--topology-id", "sq", "--state-dir", "state")
    assert doc["sinks"] == {"sink": {"committer": "Notebook", "txid": 2}}


def _status_watch(w: World, c: pytest.CaptureFixture[str], interval: str = "") -> None:
    waits: list[float] = []
    real_sleep, watcher = time.sleep, threading.current_thread()

    def sleep(seconds: float) -> None:  # the watch's pause: the second one is Ctrl-C
        if threading.current_thread() is not watcher:  # another thread's (py4j's)
            real_sleep(seconds)
            return
        waits.append(seconds)
        if len(waits) == 2:
            raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("time.sleep", sleep)
        args = ["--interval", interval] if interval else []
        out = main(w, c, "status", "--topology-id", "sq", "--state-dir", "state", "--watch", *args)
    assert "sq" in out and "currtx" in out.lower()
    assert waits == [float(interval or 2.0)] * 2


def _status_verbose(w: World, c: pytest.CaptureFixture[str]) -> None:
    main(w, c, "status", "-v", "--topology-id", "sq", "--state-dir", "state")
    assert logging.getLogger().level == logging.INFO
    assert {logging.getLogger(n).level for n in LIBRARY_LOGGERS} == {logging.INFO}


def _list_state_dir(w: World, c: pytest.CaptureFixture[str]) -> None:
    assert main(w, c, "list", "--state-dir", "state") == "sq\n"


def _list_zookeeper(w: World, c: pytest.CaptureFixture[str]) -> None:
    assert main(w, c, "list", "--zookeeper", "{zk}") == "zk\n"


def _list_session_timeout(w: World, c: pytest.CaptureFixture[str]) -> None:
    main(w, c, "list", "--zookeeper", "{zk}", "--zk-session-timeout", "5")
    assert zk_store(w).session_timeout == 5.0


def _list_config(w: World, c: pytest.CaptureFixture[str]) -> None:
    assert main(w, c, "list", "--config", "run.toml") == "zk\n"


def _list_verbose(w: World, c: pytest.CaptureFixture[str]) -> None:
    main(w, c, "list", "-vv", "--state-dir", "state")
    assert logging.getLogger().level == logging.DEBUG


def _rewind(w: World, c: pytest.CaptureFixture[str], *store: str) -> list[str]:
    out = main(w, c, "rewind", FACTORY, "--to", "1", *store)
    return out.splitlines()


def _rewind_state_dir(w: World, c: pytest.CaptureFixture[str]) -> None:
    lines = _rewind(w, c, "--topology-id", "sq", "--state-dir", "state")
    assert lines[0] == "rewinding 'sq' from txid 2 to txid 1"
    assert (w.tmp / "notebook").read_text() == "sq sink 1\n"
    assert status_json(w, c, "--topology-id", "sq", "--state-dir", "state")["currtx"] == 2


def _rewind_zookeeper(w: World, c: pytest.CaptureFixture[str]) -> None:
    _rewind(w, c, "--topology-id", "zk", "--zookeeper", "{zk}")
    assert (w.tmp / "notebook").read_text() == "zk sink 1\n"
    assert status_json(w, c, "--topology-id", "zk", "--zookeeper", "{zk}")["currtx"] == 2


def _rewind_session_timeout(w: World, c: pytest.CaptureFixture[str]) -> None:
    _rewind(w, c, "--topology-id", "zk", "--zookeeper", "{zk}", "--zk-session-timeout", "6")
    assert {s.session_timeout for s in w.opened if isinstance(s, ZooKeeperStateStore)} == {6.0}


def _rewind_config(w: World, c: pytest.CaptureFixture[str]) -> None:
    _rewind(w, c, "--config", "run.toml")
    assert (w.tmp / "notebook").read_text() == "zk sink 1\n"
    assert zk_store(w).session_timeout == 7.0


def _rewind_to(w: World, c: pytest.CaptureFixture[str]) -> None:
    out = main(w, c, "rewind", FACTORY, "--to", "0", "--topology-id", "sq", "--state-dir", "state")
    assert out.splitlines()[0] == "rewinding 'sq' from txid 2 to txid 0"
    assert status_json(w, c, "--topology-id", "sq", "--state-dir", "state")["currtx"] == 1


def _rewind_verbose(w: World, c: pytest.CaptureFixture[str]) -> None:
    _rewind(w, c, "-v", "--topology-id", "sq", "--state-dir", "state")
    assert logging.getLogger().level == logging.INFO


#: (command, flag) -> its check; a string names the test that shows it on real runs.
CASES: dict[tuple[str, str], Check | str] = {
    ("status", "--state-dir"): _status_state_dir,
    ("status", "--zookeeper"): _status_zookeeper,
    ("status", "--zk-session-timeout"): _status_session_timeout,
    ("status", "--config"): _status_config,
    ("status", "--topology-id"): _status_topology_id,
    ("status", "--json"): _status_json,
    ("status", "--watch"): _status_watch,
    ("status", "--interval"): lambda w, c: _status_watch(w, c, "0.5"),
    ("status", "--verbose"): _status_verbose,
    ("status", "MODULE:FUNCTION"): _status_factory,
    ("list", "--state-dir"): _list_state_dir,
    ("list", "--zookeeper"): _list_zookeeper,
    ("list", "--zk-session-timeout"): _list_session_timeout,
    ("list", "--config"): _list_config,
    ("list", "--verbose"): _list_verbose,
    ("rewind", "--state-dir"): _rewind_state_dir,
    ("rewind", "--topology-id"): _rewind_state_dir,
    ("rewind", "MODULE:FUNCTION"): _rewind_state_dir,
    ("rewind", "--zookeeper"): _rewind_zookeeper,
    ("rewind", "--zk-session-timeout"): _rewind_session_timeout,
    ("rewind", "--config"): _rewind_config,
    ("rewind", "--to"): _rewind_to,
    ("rewind", "--verbose"): _rewind_verbose,
    ("rewind", "--crash-at"): "tests/e2e/test_rewind.py::test_rewind_then_rerun_is_exact_and_a_"
    "killed_rewind_is_finished_by_running_it_again",
    ("query", "MODULE:FUNCTION"): "tests/unit/test_query_keys.py and tests/e2e/test_user_amounts"
    ".py::test_fractional_sums_are_exact_through_a_crash_and_a_rerun",
    ("query", "STATE"): "tests/e2e/test_user_amounts.py",
    ("query", "KEY"): "tests/unit/test_query_keys.py",
    ("query", "--committer"): "tests/e2e/test_user_amounts.py",
    ("query", "--json"): "tests/e2e/test_user_amounts.py",
    (
        "query",
        "--verbose",
    ): "tests/unit/test_cli_settings.py::test_verbose_before_or_after_the_command",
}


def flags(command: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        max(a.option_strings, key=len) if a.option_strings else str(a.metavar)
        for a in sub.choices[command]._actions
        if not isinstance(a, argparse._HelpAction)
    }


def test_every_flag_has_a_case() -> None:
    for command in ("status", "list", "rewind", "query"):
        assert flags(command) == {f for c, f in CASES if c == command}, command


def test_the_named_tests_exist() -> None:
    root = Path(__file__).resolve().parents[2]
    for shown in (v for v in CASES.values() if isinstance(v, str)):
        for part in shown.split(" and "):
            path, _, name = part.partition("::")
            assert (root / path).is_file(), path
            assert not name or f"def {name}(" in (root / path).read_text(), part


@pytest.mark.parametrize(
    "case", [k for k, v in CASES.items() if not isinstance(v, str)], ids="-".join
)
def test_a_flag_reaches_what_it_controls(
    case: tuple[str, str], world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    check = CASES[case]
    assert callable(check)
    check(world, capsys)
