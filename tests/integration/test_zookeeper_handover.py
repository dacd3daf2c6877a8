"""A killed leader's ZooKeeper session handed back at once (``coordinators._zk_handover``),
on a real ZooKeeper: a SIGKILLed child's session closed by the next start on this
machine, well within its session timeout; a live leader never taken over; a reused pid
told apart by its start time; a malformed session file ignored; old files pruned."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import select
import signal
import stat
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from coordinators import ZooKeeperStateStore
from coordinators._zk_handover import SessionFile, _dead, process_identity
from tests.witness import process_state, waited
from transactional.errors import LostLeadershipError

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = "tweets"
LEADER = f"/transactional/{TOPOLOGY}/leader"
#: Long enough that waiting for it could not pass for the handover.
SESSION_S = 30.0

CHILD = """
import sys
import types
from coordinators import ZooKeeperStateStore

store = ZooKeeperStateStore(sys.argv[1], session_timeout=float(sys.argv[2]))
store.open(sys.argv[3])
store.acquire_leadership(timeout=30)
print("leading", store._session_id, flush=True)
sys.stdin.read()  # until killed, or the test closes stdin
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Session files under this test's directory, for this process and its children."""
    path = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(path))
    return path


class Child:
    """A process that leads ``TOPOLOGY`` on ``hosts`` until it is killed."""

    def __init__(self, hosts: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, hosts, str(SESSION_S), TOPOLOGY],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.output = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_leading(self, timeout: float = 60) -> int:
        """The session id the child leads on, once it says so."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self.output.partition(b"leading ")[2]:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.proc.poll() is not None:
                raise AssertionError(f"the child did not lead:\n{self.output.decode()}")
            ready, _, _ = select.select([self.proc.stdout], [], [], remaining)
            if ready:
                self.output += os.read(self.proc.stdout.fileno(), 4096)
        return int(self.output.partition(b"leading ")[2].split()[0])

    def kill(self) -> None:
        """SIGKILL, and reap: no close, no goodbye to ZooKeeper."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(timeout=30) == -signal.SIGKILL

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@contextmanager
def child(hosts: str) -> Iterator[Child]:
    leader = Child(hosts)
    try:
        yield leader
    finally:
        leader.close()


@contextmanager
def zk(hosts: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=hosts)
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def leader_owner(hosts: str) -> int | None:
    """The session that owns the leader node (None: no leader node)."""
    with zk(hosts) as client:
        node = client.exists(LEADER)
    return None if node is None else int(node.ephemeralOwner)


@contextmanager
def store(hosts: str, credentials: str | None = None) -> Iterator[ZooKeeperStateStore]:
    opened = ZooKeeperStateStore(hosts, session_timeout=SESSION_S, credentials=credentials)
    opened.open(TOPOLOGY)
    try:
        yield opened
    finally:
        opened.close()


def recorded(hosts: str) -> dict[str, object]:
    return dict(json.loads(SessionFile(hosts, TOPOLOGY).path.read_text()))


def test_a_killed_leaders_session_is_closed_by_the_next_start(
    zk_hosts: str, cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = SessionFile(zk_hosts, TOPOLOGY).path
    with child(zk_hosts) as killed:
        session = killed.wait_leading()
        assert recorded(zk_hosts)["session"] == session
        assert recorded(zk_hosts)["pid"] == killed.pid
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        killed.kill()
    # The fault fired, and the session outlived its process: its node is still there.
    assert leader_owner(zk_hosts) == session

    with store(zk_hosts) as new, caplog.at_level(logging.INFO, "transactional.zookeeper"):
        began = time.monotonic()
        new.acquire_leadership(timeout=10)  # else LostLeadershipError: the deadline
        took = time.monotonic() - began
        assert took < 10 < SESSION_S
        new.check_leadership()
        assert leader_owner(zk_hosts) == new._session_id != session
        assert recorded(zk_hosts)["session"] == new._session_id
        lines = [r.getMessage() for r in caplog.records if r.name == "transactional.zookeeper"]
        assert len(lines) == 1, lines
        assert f"runner pid {killed.pid}" in lines[0] and f"0x{session:x}" in lines[0]
    assert not path.exists()  # a clean close takes its file away


def test_a_live_leader_is_never_taken_over(zk_hosts: str, cache: Path) -> None:
    with child(zk_hosts) as live, store(zk_hosts) as standby:
        session = live.wait_leading()
        began = time.monotonic()
        with pytest.raises(LostLeadershipError, match="another runner holds topology"):
            standby.acquire_leadership(timeout=3)
        assert time.monotonic() - began >= 3  # it waited, as a standby does
        assert live.proc.poll() is None
        assert leader_owner(zk_hosts) == session
        assert recorded(zk_hosts)["session"] == session


@pytest.mark.parametrize("credentials", [None, "alice:s3cret"])
def test_the_start_time_tells_a_reused_pid_from_the_leader_that_had_it(
    zk_hosts: str, cache: Path, credentials: str | None
) -> None:
    path = SessionFile(zk_hosts, TOPOLOGY).path
    with store(zk_hosts, credentials) as first, store(zk_hosts, credentials) as second:
        first.acquire_leadership(timeout=10)
        document = recorded(zk_hosts)
        me = process_identity()
        assert (document["pid"], document["start"]) == (me.pid, me.start)
        # This process, alive, with the start time recorded: its session is not touched.
        with pytest.raises(LostLeadershipError):
            second.acquire_leadership(timeout=1)
        first.check_leadership()
        assert leader_owner(zk_hosts) == first._session_id

        # The same pid under another start time: the leader that had this pid is gone,
        # and the pid reused (by this process). Its session is closed.
        path.write_text(json.dumps({**document, "start": me.start + 1}))
        began = time.monotonic()
        second.acquire_leadership(timeout=10)
        assert time.monotonic() - began < 10
        assert leader_owner(zk_hosts) == second._session_id
        with pytest.raises(LostLeadershipError):
            first.check_leadership()
        assert recorded(zk_hosts)["session"] == second._session_id
        first.close()  # a deposed leader's close leaves its successor's file
        assert recorded(zk_hosts)["session"] == second._session_id
    assert not path.exists()


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[1, 2]",
        b'{"session": 1}',
        b'{"session": 1, "password": "zz", "pid": 1, "start": 1, "boot": "", "pidns": ""}',
        b"{" + b" " * 10_000 + b"}",
    ],
)
def test_a_malformed_session_file_is_ignored_and_removed(
    zk_hosts: str, cache: Path, content: bytes
) -> None:
    path = SessionFile(zk_hosts, TOPOLOGY).path
    with store(zk_hosts) as first, store(zk_hosts) as second:
        first.acquire_leadership(timeout=10)
        path.write_bytes(content)
        with pytest.raises(LostLeadershipError):  # the election's own refusal, no other
            second.acquire_leadership(timeout=1)
        assert not path.exists()
        first.check_leadership()
        first.close()
        path.write_bytes(content)
        second.acquire_leadership(timeout=10)
        assert recorded(zk_hosts)["session"] == second._session_id


def test_a_zombie_is_dead_and_another_boot_or_namespace_cannot_be_judged() -> None:
    me = process_identity()
    assert _dead(me, me) is False
    assert _dead(dataclasses.replace(me, start=me.start + 1), me) is True
    assert _dead(dataclasses.replace(me, boot="another-boot"), me) is None
    assert _dead(dataclasses.replace(me, pidns="pid:[1]"), me) is None
    proc = subprocess.Popen(["sleep", "600"])
    try:
        sleeper = process_identity(proc.pid)
        assert _dead(sleeper, me) is False
        os.kill(proc.pid, signal.SIGKILL)
        pid = proc.pid
        waited("the killed process a zombie", lambda: process_state(pid) == "Z" or None, 30, 0.01)
        assert _dead(sleeper, me) is True  # killed, not yet reaped
    finally:
        proc.kill()
        proc.wait()
    assert _dead(sleeper, me) is True  # reaped: no such pid


def test_old_files_are_pruned_unless_their_process_lives(cache: Path) -> None:
    def recorded_file(hosts: str, session: int) -> Path:
        client = types.SimpleNamespace(client_id=(session, b"\x07" * 16))
        file = SessionFile(hosts, TOPOLOGY)
        file.record(client, session, "runner")
        return file.path

    live = recorded_file("127.0.0.1:1", 1)
    dead = recorded_file("127.0.0.1:2", 2)
    fresh_dead = recorded_file("127.0.0.1:3", 3)
    for path in (dead, fresh_dead):
        document = json.loads(path.read_text())
        path.write_text(json.dumps({**document, "start": document["start"] + 1}))
    garbage = live.with_name("0" * 32 + ".json")
    garbage.write_text("not json")
    two_days_ago = time.time() - 2 * 86400
    for path in (live, dead, garbage):
        os.utime(path, (two_days_ago, two_days_ago))

    recorded_file("127.0.0.1:4", 4)
    assert live.exists() and fresh_dead.exists()
    assert not dead.exists() and not garbage.exists()
