"""What a long run shows: a live line on a terminal, and otherwise a periodic status
line (a heartbeat for a log file or CI output, not a torrent), as ``key=value`` text."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from transactional._logfmt import kv

__all__ = ["ProgressListener"]


class ProgressListener:
    """The runner's listener: counts committed txids and records and shows them.

    ``on_commit`` is called from the runner's commit path, so it only updates counters
    and a display that refreshes on its own thread; it never blocks on output.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        live: bool | None = None,
        lag: Callable[[], int | None] | None = None,
        line: Callable[[str], None] | None = None,
        guarantee: str = "exactly_once",
    ) -> None:
        self.stream = stream or sys.stdout
        #: Where a periodic line goes when the display is not live (default: ``stream``).
        self.line = line or (lambda text: print(text, file=self.stream, flush=True))
        #: How far the source is ahead of the last txid decided (``Spout.lag``).
        self.lag = lag or (lambda: None)
        self.interval_s = interval_s
        self.clock = clock
        self.live = self.stream.isatty() if live is None else live
        #: The run's guarantee (``RunnerConfig.guarantee``), shown with the counts.
        self.guarantee = str(guarantee)
        self.txids = 0
        self.records = 0
        self.last_txid = 0
        #: at_most_once: txids dropped, and the records they were counted with.
        self.dropped_txids = 0
        self.dropped_records = 0
        self._lock = threading.Lock()
        self._started = clock()
        self._last_line = self._started
        self._progress: object | None = None
        self._task: object | None = None

    def __enter__(self) -> ProgressListener:
        if self.live:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            progress = Progress(
                SpinnerColumn(),
                TextColumn("[bold]committed[/] txid {task.fields[txid]}"),
                TextColumn("{task.completed:,} records"),
                TextColumn("{task.fields[rate]:,.0f} records/s"),
                TextColumn("{task.fields[lag]}"),
                TextColumn("{task.fields[dropped]}"),
                TextColumn(self.guarantee),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._task = progress.add_task("run", total=None, txid=0, rate=0.0, lag="", dropped="")
            progress.start()
            self._progress = progress
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()  # type: ignore[attr-defined]
            self._progress = None

    @property
    def rate(self) -> float:
        elapsed = self.clock() - self._started
        return self.records / elapsed if elapsed > 0 else 0.0

    def on_commit(self, txid: int, records: int) -> None:
        with self._lock:
            self.txids += 1
            self.records += records
            self.last_txid = txid
            self._show()

    def on_drop(self, txid: int, records: int | None) -> None:
        """``at_most_once``: ``txid`` was dropped (``records``: None if it failed before
        they were counted); the runner calls this when the store moves past it."""
        with self._lock:
            self.dropped_txids += 1
            self.dropped_records += records or 0
            self._show()

    def _show(self) -> None:
        if self._progress is not None:
            lag = self.lag()
            self._progress.update(  # type: ignore[attr-defined]
                self._task,
                completed=self.records,
                txid=self.last_txid,
                rate=self.rate,
                lag="" if lag is None else f"lag {lag:,}",
                dropped=f"dropped {self.dropped_txids:,}" if self.dropped_txids else "",
            )
            return
        now = self.clock()
        if now - self._last_line >= self.interval_s:
            self._last_line = now
            self.line(self.status())

    def status(self) -> str:
        lag = self.lag()
        return kv(
            "progress",
            committed_txids=self.txids,
            last_txid=self.last_txid,
            records=self.records,
            records_per_s=f"{self.rate:.0f}",
            elapsed_s=f"{self.clock() - self._started:.0f}",
            **({} if lag is None else {"lag": lag}),
            guarantee=self.guarantee,
            **(
                {"dropped_txids": self.dropped_txids, "dropped_records": self.dropped_records}
                if self.dropped_txids
                else {}
            ),
        )
