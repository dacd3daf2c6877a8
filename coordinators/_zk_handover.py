"""A killed leader's ZooKeeper session, handed back at once on the next start on the same
machine, rather than left to time out with its ephemeral ``leader`` node.

A store that wins leadership records its session (id and password, which is all
ZooKeeper asks of a client that rejoins a session), its pid, the process's start time
and the machine's boot id in a file of its own (mode 0600, in a directory only this
user reads: ``$XDG_CACHE_HOME/transactional/zookeeper-sessions``, else
``~/.cache/...``), one per connection string and topology. Before it waits for the
leader node, a store reads that file: when it names a process of this boot and pid
namespace that no longer lives (no such pid, another process's start time under it, or
a zombie), it rejoins that session and closes it, and the server deletes its ephemeral
nodes at once. A live process's session is never touched, nor one recorded on another
machine or in another pid namespace, where its pid means nothing here. The file goes
when its leader closes the store.

It only saves the wait: the fence (the new leader bumps ``currtx``'s version) keeps a
deposed leader from writing whatever this does. So nothing here may fail a run: a file
that cannot be read or makes no sense is logged at DEBUG and removed, a session that
cannot be reached is left to its timeout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

__all__ = ["SessionFile", "process_identity", "sessions_dir"]

log = logging.getLogger("transactional.zookeeper")

#: A record is a few hundred bytes; anything much larger is not one.
_MAX_BYTES = 4096
#: A session file this old names a session long ended, unless its process still lives.
_STALE_SECONDS = 86400.0


class _Quiet(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Kazoo's logging for the client that rejoins a dead session, all at DEBUG: its
    warnings ("Session has expired" when the session ended on its own) are the expected
    outcome here, not news for the operator."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        super().log(min(level, logging.DEBUG), msg, *args, **kwargs)


_KAZOO_LOG = _Quiet(logging.getLogger("transactional.zookeeper.handover"), {})


def sessions_dir() -> Path:
    """Where this user's session files live (not created here)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "transactional" / "zookeeper-sessions"


@dataclass(frozen=True)
class Process:
    """What tells a process apart on one machine across pid reuse and reboots."""

    pid: int
    start: int  # clock ticks after boot (field 22 of /proc/<pid>/stat)
    boot: str  # /proc/sys/kernel/random/boot_id
    pidns: str  # readlink /proc/<pid>/ns/pid: a pid names this process only in it


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time)`` of ``pid`` from /proc (None: no such process)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rpartition(")")[2].split()  # the command, in parentheses, may hold spaces
    if len(fields) < 20:
        raise ValueError(f"/proc/{pid}/stat has {len(fields)} fields after the command")
    return fields[0], int(fields[19])


def process_identity(pid: int | None = None) -> Process:
    """This process's identity (or ``pid``'s); OSError or ValueError where /proc does
    not tell (not Linux)."""
    pid = os.getpid() if pid is None else pid
    seen = _proc_stat(pid)
    if seen is None:
        raise ProcessLookupError(pid)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return Process(pid, seen[1], boot, os.readlink(f"/proc/{pid}/ns/pid"))


def _dead(recorded: Process, here: Process) -> bool | None:
    """True: ``recorded`` is gone (no such pid, another process under it, a zombie).
    False: it lives. None: it was on another boot or in another pid namespace, where
    /proc here says nothing about it."""
    if recorded.boot != here.boot or recorded.pidns != here.pidns:
        return None
    seen = _proc_stat(recorded.pid)
    return seen is None or seen[1] != recorded.start or seen[0] in ("Z", "X")


def _key(hosts: str, topology: str) -> str:
    """The same file for every spelling of one ensemble: servers in any order."""
    servers, slash, chroot = hosts.partition("/")
    canonical = ",".join(sorted(s.strip() for s in servers.split(","))) + slash + chroot
    return hashlib.sha256(f"{canonical}\n{topology}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class _Record:
    """What a session file holds."""

    session_id: int
    password: bytes
    process: Process
    hosts: str
    topology: str


def _load(path: Path) -> _Record | None:
    """The record in ``path`` (None: no file). Raises OSError, ValueError, TypeError or
    KeyError for a file that is not this user's own regular file, or not a record."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid()):
            raise ValueError("not a regular file of this user")
        data = os.read(fd, _MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_BYTES:
        raise ValueError("too large to be a session record")
    document = json.loads(data)
    process = Process(
        int(document["pid"]), int(document["start"]), str(document["boot"]), str(document["pidns"])
    )
    password = bytes.fromhex(document["password"])
    return _Record(
        int(document["session"]), password, process, document["hosts"], document["topology"]
    )


def _prune(directory: Path, here: Process) -> None:
    """Remove the session files over a day old that no live process here wrote: a
    killed runner's topology may never start again, and its file would stay for ever.
    (Their sessions ended long ago.)"""
    cutoff = time.time() - _STALE_SECONDS
    for path in directory.glob("*.json"):
        try:
            if path.stat().st_mtime >= cutoff:
                continue
            record = _load(path)
            if record is not None and _dead(record.process, here) is False:
                continue
            path.unlink()
        except (OSError, ValueError, TypeError, KeyError):
            with contextlib.suppress(OSError):
                path.unlink()


class SessionFile:
    """The session file of one topology on one ensemble."""

    def __init__(self, hosts: str, topology: str, directory: Path | None = None) -> None:
        self.hosts = hosts
        self.topology = topology
        self.path = (directory or sessions_dir()) / f"{_key(hosts, topology)}.json"

    def record(self, client: Any, session_id: int | None, runner_id: str) -> None:
        """Record that this process leads on ``client``'s session ``session_id`` (not
        if the client is on another one by now); written whole or not at all (a
        temporary file renamed over it), readable by this user only."""
        client_id = client.client_id
        if session_id is None or client_id is None or client_id[0] != session_id:
            return
        try:
            me = process_identity()
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.path.parent.chmod(0o700)
            document = {
                "session": client_id[0],
                "password": client_id[1].hex(),
                "pid": me.pid,
                "start": me.start,
                "boot": me.boot,
                "pidns": me.pidns,
                "hosts": self.hosts,
                "topology": self.topology,
                "runner": runner_id,  # for an operator reading the file
            }
            temporary = self.path.with_name(f".{self.path.name}.{me.pid}.tmp")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                os.fchmod(fd, 0o600)
                os.write(fd, json.dumps(document).encode())
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
            _prune(self.path.parent, me)
        except (OSError, ValueError) as exc:
            log.debug("cannot record the ZooKeeper session in %s: %r", self.path, exc)

    def forget(self, session_id: int | None) -> None:
        """Remove the file if it still names ``session_id`` (a later leader's stays)."""
        try:
            record = _load(self.path)
        except (OSError, ValueError, TypeError, KeyError):
            return
        if record is not None and record.session_id == session_id:
            self._remove()

    def hand_back(self, timeout: float) -> None:
        """If the file names a dead process of this machine, close its session (its
        ``leader`` node goes with it) and remove the file; within ``timeout`` seconds."""
        try:
            record = _load(self.path)
            if record is None:
                return
            if (record.hosts, record.topology) != (self.hosts, self.topology):
                raise ValueError("recorded for another topology or ensemble")
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.debug("ignoring the unreadable ZooKeeper session file %s: %r", self.path, exc)
            self._remove()
            return
        pid = record.process.pid
        try:
            dead = _dead(record.process, process_identity())
        except (OSError, ValueError) as exc:
            log.debug("cannot tell whether pid %d lives: %r", pid, exc)
            return
        if not dead:
            return  # a live leader's (or one this machine cannot judge): never touched
        closed = _close_session(self.hosts, record.session_id, record.password, timeout)
        if closed is None:
            return  # ZooKeeper not reached: the file stays for the next try
        if closed:
            log.info(
                "closed the ZooKeeper session 0x%x of runner pid %d, no longer running, "
                "which led topology %r: its leader node goes now, not at its session "
                "timeout",
                record.session_id,
                pid,
                self.topology,
            )
        else:
            log.debug("the ZooKeeper session 0x%x of pid %d had ended", record.session_id, pid)
        self.forget(record.session_id)

    def _remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def _close_session(hosts: str, session_id: int, password: bytes, timeout: float) -> bool | None:
    """Rejoin the session and close it: True when it was closed, False when it had
    already ended (the server gave a new session instead), None when ZooKeeper could
    not be reached within ``timeout``. Closing a session takes no credentials: the
    session's id and password are its proof."""
    client = KazooClient(hosts=hosts, client_id=(session_id, password), logger=_KAZOO_LOG)
    try:
        client.start(timeout=timeout)  # stops and closes the client when it times out
    except (KazooException, KazooTimeoutError, OSError, ValueError) as exc:
        log.debug("cannot reach ZooKeeper at %s to close a dead session: %r", hosts, exc)
        return None
    try:
        current = client.client_id
        return current is not None and current[0] == session_id
    finally:
        client.stop()  # closes the session: the server deletes its ephemeral nodes
        client.close()
