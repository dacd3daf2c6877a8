"""The chaos campaign's worker kill picks a worker that runs one of the run's executors:
``tests.witness.executors_in_session`` reads them from the processes' command lines."""

from __future__ import annotations

import subprocess
import sys
from functools import partial

from tests.witness import executors_in_session, waited


def _seen(pid: int, app: str) -> set[str] | None:
    return executors_in_session(pid, app) or None


def test_executors_are_found_by_session_and_application() -> None:
    # Stand-ins for executor JVMs: sleeping processes with an executor's arguments, each
    # in a session of its own, as a Spark worker and the executors it launches are.
    def executor(executor_id: str, app: str) -> subprocess.Popen[bytes]:
        code = "import time; time.sleep(60)"
        args = ["--executor-id", executor_id, "--hostname", "127.0.0.1", "--app-id", app]
        return subprocess.Popen([sys.executable, "-c", code, *args], start_new_session=True)

    first, second = executor("3", "app-1"), executor("0", "app-2")
    try:
        # A child is in its session with its arguments once it has called setsid and
        # exec: moments after Popen returns, longer on a busy machine.
        for pid, app in ((first.pid, "app-1"), (second.pid, "app-2")):
            waited(f"stand-in {pid} started", partial(_seen, pid, app), 30, 0.01)
        assert executors_in_session(first.pid, "app-1") == {"3"}
        assert executors_in_session(first.pid, "app-2") == set()  # another application's
        assert executors_in_session(second.pid, "app-2") == {"0"}
        assert executors_in_session(second.pid, "app-1") == set()
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
    assert executors_in_session(first.pid, "app-1") == set()  # gone with its process
