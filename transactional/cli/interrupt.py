"""Ctrl-C and SIGTERM stop a run cleanly: the runner finishes the step it is in, abandons
what is in flight (those txids replay on the next run, from their stored metadata) and
returns; a commit already running completes, so nothing is half-written."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

#: Exit status of a run stopped by SIGINT or SIGTERM (128 + SIGINT, the shell's convention).
INTERRUPTED = 130


class Interruption:
    """Which signal stopped the run, if one did."""

    def __init__(self) -> None:
        self.signal: int | None = None

    @property
    def name(self) -> str:
        return "" if self.signal is None else signal.Signals(self.signal).name


@contextlib.contextmanager
def stop_on_signals(
    stop: Callable[[], None], cancel: Callable[[], Any] | None = None
) -> Iterator[Interruption]:
    """While inside: the first SIGINT or SIGTERM calls ``stop`` (and ``cancel``, to end
    running Spark jobs at once); a second one exits at once with status 130. Installed
    over whatever handler is there (PySpark puts its own SIGINT handler in place when a
    SparkContext starts), and the previous handlers are put back on the way out. Outside
    the main thread, signals cannot be caught: nothing is installed."""
    seen = Interruption()
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if seen.signal is not None:
            print("interrupted again: exiting at once", file=sys.stderr, flush=True)
            raise SystemExit(INTERRUPTED)
        seen.signal = signum
        stop()
        if cancel is not None:
            with contextlib.suppress(Exception):
                cancel()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield seen
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
