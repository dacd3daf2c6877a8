"""An exclusive ``flock`` on a lock file: leadership among runners on one machine.

The lock alone is not a fence: a runner whose lock file was deleted keeps its lock on
the old inode while another runner locks the new one. ``held()`` tells that case apart
(the path no longer names the locked inode); the SQLite store adds a fence counter in
the database for the rest.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["LockFile", "is_held"]

_POLL_SECONDS = 0.05


class LockFile:
    """The lock on ``path``; ``acquire`` blocks, ``release`` is idempotent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def locked(self) -> bool:
        return self._fd is not None

    def held(self) -> bool:
        """Locked, and on the file ``path`` names now: a lock on an unlinked (or
        replaced) lock file excludes nobody."""
        return self._fd is not None and _is_current(self._fd, self.path)

    def acquire(self, timeout: float | None, refused: Callable[[str], Exception]) -> None:
        """Lock, waiting up to ``timeout`` seconds (None: for ever); past it, raise
        ``refused(holder)`` with what the holder wrote in the file."""
        if self._fd is not None and not _is_current(self._fd, self.path):
            self.release()
        if self._fd is not None:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                if deadline is not None and time.monotonic() >= deadline:
                    raise refused(holder) from None
                time.sleep(_POLL_SECONDS)
                continue
            if _is_current(fd, self.path):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
                self._fd = fd
                return
            # The file was deleted between our open and our lock: lock the new one.
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def is_held(path: Path) -> bool | None:
    """Whether a process holds the lock on ``path`` now (None: the file cannot be
    read), for a look from outside (``transactional status``): the lock is tried shared
    for an instant, and a missing file is not created (nobody holds it). A process's
    locks go with it, SIGKILL or not, so a free lock is a runner gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # releases the shared lock, if taken
    return False


def _is_current(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
