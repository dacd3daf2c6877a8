"""The fault points as a contract: stable names, each met at most once per attempt and
in protocol order; ``KillAt`` (``--crash-at``) parsing and firing; and the process-tree
kill really leaving nothing alive, whether or not the dying process leads its group."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from transactional.config import RunnerConfig
from transactional.errors import ConfigurationError, InjectedFault
from transactional.faults import (
    CRASH_MARKER,
    CombinedFaults,
    FaultPoint,
    KillAt,
    RandomFaults,
    combine,
    parse_crash_at,
)
from transactional.runner import TransactionalRunner
from transactional.testing import (
    CountingBolt,
    InMemoryEngine,
    InMemoryStateStore,
    ListOpaqueSpout,
    ListPartitionedSpout,
    ListTransactionalSpout,
    MemoryCommitter,
)
from transactional.topology import TopologyBuilder
from transactional.types import CommitMode, TransactionAttempt

ORDER = list(FaultPoint)


def test_fault_point_names_are_the_ones_the_command_line_documents() -> None:
    # Renaming one breaks every recorded `--crash-at` / TRANSACTIONAL_CRASH_AT.
    assert [(p.name, p.value) for p in FaultPoint] == [
        ("AFTER_STORE_META", "after_store_meta"),
        ("EMIT", "emit"),
        ("PROCESS", "process"),
        ("BEFORE_SINK_WRITE", "before_sink_write"),
        ("BETWEEN_COMMITTERS", "between_committers"),
        ("AFTER_SINK_WRITE", "after_sink_write"),
        ("AFTER_ADVANCE", "after_advance"),
    ]


class Recorder:
    """Records every check; fails the first attempt of the chosen txids at one point."""

    def __init__(self, fail_at: dict[int, FaultPoint]) -> None:
        self.fail_at = fail_at
        self.seen: list[tuple[FaultPoint, TransactionAttempt, int]] = []
        self.lock = threading.Lock()

    def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        with self.lock:
            self.seen.append((point, attempt, number))
        if number == 1 and self.fail_at.get(attempt.txid) is point:
            raise InjectedFault(f"{point.value} of txid {attempt.txid}")


SPOUTS: dict[str, Any] = {
    "transactional": lambda data: ListTransactionalSpout(data, 4),
    "partitioned": lambda data: ListPartitionedSpout([data[0::2], data[1::2]], 2),
    "opaque": lambda data: ListOpaqueSpout([data[0::2], data[1::2]], 2),
}


@pytest.mark.parametrize("kind", SPOUTS)
def test_every_point_is_met_at_most_once_per_attempt_and_in_protocol_order(kind: str) -> None:
    data = [f"r{i % 5}" for i in range(24)]  # 6 txids
    mode = CommitMode.OPAQUE if kind == "opaque" else CommitMode.TRANSACTIONAL
    sinks = [MemoryCommitter(mode) for _ in range(3)]  # three committers: two gaps
    builder = TopologyBuilder().set_spout(SPOUTS[kind](data)).set_bolt("count", CountingBolt())
    for i, sink in enumerate(sinks):
        builder = builder.set_committer(f"sink{i}", sink, "count")
    # One failure at each point that a retry can survive, on different txids.
    recorder = Recorder(
        {
            1: FaultPoint.EMIT,
            2: FaultPoint.BETWEEN_COMMITTERS,
            3: FaultPoint.AFTER_SINK_WRITE,
            4: FaultPoint.PROCESS,
        }
    )
    config = RunnerConfig(
        topology_id="t",
        max_pending=3,
        backoff_initial_s=0.0,
        backoff_max_s=0.0,
        poll_interval_s=0.01,
    )
    TransactionalRunner(
        builder.build(),
        InMemoryStateStore(),
        config=config,
        engine=InMemoryEngine(),
        faults=recorder,
    ).run(until_drained=True)

    per_attempt: dict[TransactionAttempt, list[FaultPoint]] = defaultdict(list)
    for point, attempt, _ in recorder.seen:
        per_attempt[attempt].append(point)
    for attempt, points in per_attempt.items():
        assert len(points) == len(set(points)), (attempt, points)
        assert points == sorted(points, key=ORDER.index), (attempt, points)
    # Every committed txid's last attempt met all seven points, each once.
    last = {a.txid: a for a in sorted(per_attempt, key=lambda a: a.attempt_id)}
    assert sorted(last) == [1, 2, 3, 4, 5, 6]
    for attempt in last.values():
        assert per_attempt[attempt] == ORDER
    for sink in sinks:
        assert sink.counts == Counter(data)


def test_crash_at_parses_points_and_txids_and_refuses_anything_else() -> None:
    assert parse_crash_at("emit:2, AFTER-SINK-WRITE:3,after_advance:10") == [
        (FaultPoint.EMIT, 2),
        (FaultPoint.AFTER_SINK_WRITE, 3),
        (FaultPoint.AFTER_ADVANCE, 10),
    ]
    for bad in ("emit", "emit:", "emit:0", "emit:x", "nowhere:2", "emit:2,,process:3"):
        with pytest.raises(ConfigurationError, match="POINT:TXID") as info:
            parse_crash_at(bad)
        assert "after_store_meta" in str(info.value)  # the message lists the points


def test_kill_at_fires_once_at_its_point_and_txid_only(capfd: pytest.CaptureFixture[str]) -> None:
    kills: list[int] = []
    plan = KillAt([(FaultPoint.PROCESS, 2), (FaultPoint.EMIT, 5)], kill=lambda: kills.append(1))
    plan.check(FaultPoint.PROCESS, TransactionAttempt(1, 1), 1)  # other txid
    plan.check(FaultPoint.EMIT, TransactionAttempt(2, 2), 1)  # other point
    assert kills == []
    plan.check(FaultPoint.PROCESS, TransactionAttempt(2, 7), 3)  # any attempt number
    plan.check(FaultPoint.PROCESS, TransactionAttempt(2, 8), 4)
    assert kills == [1]
    assert plan.pending == [(FaultPoint.EMIT, 5)]
    err = capfd.readouterr().err
    assert err == f"{CRASH_MARKER} point=process txid=2 attempt=7 number=3 pid={os.getpid()}\n"


def test_combined_plans_check_each_in_turn() -> None:
    kills: list[int] = []
    crash = KillAt([(FaultPoint.EMIT, 1)], kill=lambda: kills.append(1))
    assert combine(None, None) is None
    assert combine(None, crash) is crash
    rate = RandomFaults(0.5, seed=1)
    both = combine(rate, crash)
    assert isinstance(both, CombinedFaults) and both.plans == (rate, crash)
    number = next(n for n in range(1, 50) if rate.planned(1, n) is None)
    both.check(FaultPoint.EMIT, TransactionAttempt(1, 1), number)  # rate passes, crash fires
    assert kills == [1]


# A process that starts a tree like the driver's (a child, and a grandchild that moves
# to a process group of its own, as PySpark's worker daemon does), then kills itself
# with kill_process_tree. It prints the pids first.
TREE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from transactional.faults import kill_process_tree
    grandchild = "import os, time; os.setpgid(0, 0); time.sleep(120)"
    child = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}]); "
        "print(p.pid, flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    grand = child.stdout.readline().strip()
    deadline = time.monotonic() + 30
    while os.getpgid(int(grand)) != int(grand):  # until the grandchild has left the group
        assert time.monotonic() < deadline, "the grandchild did not leave the group"
        time.sleep(0.01)
    print(os.getpid(), child.pid, grand, flush=True)
    kill_process_tree()
    time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie is dead; only its parent's wait is missing


@pytest.mark.parametrize("leads_group", [True, False], ids=["group-leader", "not-leader"])
def test_kill_process_tree_leaves_no_descendant_alive(leads_group: bool) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-c", TREE],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=leads_group,
    )
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert proc.wait(timeout=60) == -9
    assert len(pids) == 3
    deadline = time.monotonic() + 30  # SIGKILL is delivered asynchronously
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if _alive(p)] == []


def test_both_commands_refuse_a_bad_crash_plan_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from examples.tweets.cli import main as demo
    from transactional.cli import main as transactional

    monkeypatch.setenv("TRANSACTIONAL_CRASH_AT", "emit:0")  # read by the demo's `run`
    assert demo(["run", "--state-dir", str(tmp_path)], out=io.StringIO()) == 2
    assert "TRANSACTIONAL_CRASH_AT" in capsys.readouterr().err
    assert (
        transactional(
            [
                "run",
                "no.such:factory",
                "--topology-id",
                "t",
                "--crash-at",
                "nowhere:1",
                "--state-dir",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "'nowhere:1'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # refused before the store or a sample was made
