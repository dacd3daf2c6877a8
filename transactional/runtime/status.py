"""What an operator sees of a running topology: the runner's status document.

``Status`` is a probe: it watches the machine's commands and the executor's timings
(the txids in flight, the step each is in, the last error, the commits and their
records) and, every ``interval_s`` and when the run ends, publishes a JSON document to
the state store (``StateStore.publish_status``) from the runner's own thread, where
every store call is made. ``transactional status`` reads it back with the store's
state and each sink's marker.

The document is a report, not part of the protocol: it is written without the fence
(a deposed runner's last report may stand until the new leader's first), and nothing
reads it to decide anything.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from transactional.runtime import messages as m
from transactional.runtime.probes import Probe
from transactional.runtime.state import Counts
from transactional.types import Guarantee, TransactionAttempt

__all__ = ["RATE_WINDOW_S", "STEP_AFTER", "Status"]

#: The latest dropped txids a status document lists (``at_most_once``).
DROPPED_SHOWN = 20
#: Records per second are measured over the commits of this many last seconds.
RATE_WINDOW_S = 60.0
#: The step a txid is in once the executor reports the one before done.
STEP_AFTER = {
    "store": "emit",
    "emit": "process",
    "process": "prepare",
    "prepare": "wait for commit",
    "commit": "advance",
}


def _now_iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds")


def _nothing() -> int | None:
    return None


def _leader() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


@dataclass(eq=False)
class Status(Probe):
    """The runner's status document, kept current and published to the store
    (``publish_to``)."""

    topology_id: str
    publish_to: Callable[[dict[str, Any]], None]
    counts: Counts
    lag: Callable[[], int | None] = _nothing
    batch_size: Callable[[], int | None] = _nothing
    fence: Callable[[], int | None] = _nothing
    interval_s: float = 2.0
    wall: Callable[[], float] = time.time
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    #: at_most_once: the latest txids dropped (failed, never retried), newest last.
    dropped: deque[dict[str, Any]] = field(
        init=False, default_factory=lambda: deque(maxlen=DROPPED_SHOWN)
    )
    leader: dict[str, Any] = field(init=False, default_factory=_leader)
    #: txid -> its attempt, the step it is in, and since when (wall clock).
    in_flight: dict[int, dict[str, Any]] = field(init=False, default_factory=dict)
    last_error: dict[str, Any] | None = field(init=False, default=None)
    retries: int = field(init=False, default=0)
    failures: Counter[str] = field(init=False, default_factory=Counter)
    last_stored: int = field(init=False, default=0)
    currtx: int = field(init=False, default=1)
    stopped_at: float | None = field(init=False, default=None)
    _commits: deque[tuple[float, int]] = field(init=False, default_factory=deque)
    _published: float = field(init=False, default=float("-inf"))
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.started_at = self.wall()

    # -- watching ----------------------------------------------------------------------

    def on_event(self, event: m.Event, now: float) -> None:
        if isinstance(event, m.Opened):
            self.currtx = event.currtx
            self.last_stored = max(event.stored, default=self.currtx - 1)
            for txid in event.dropped:
                self._dropped(txid, "restart", "in flight when the last run stopped")
        elif isinstance(event, m.Started):
            self.last_stored = max(self.last_stored, event.attempt.txid)
            self._step(event.attempt, "emit")
        self.maybe_publish()

    def on_command(self, command: m.Command, now: float) -> None:
        match command:
            case m.Emit(attempt, number) | m.Replay(attempt, number):
                self._step(attempt, "emit", number)
            case m.Commit(attempt, _, more):
                for member in (attempt, *(a for a, _ in more)):
                    self._step(member, "commit")
            case m.Acknowledge(attempt, _, records, _):
                with self._lock:
                    self.in_flight.pop(attempt.txid, None)
                self.currtx = max(self.currtx, attempt.txid + 1)
                wall = self.wall()
                self._commits.append((wall, records))
                while self._commits and self._commits[0][0] < wall - RATE_WINDOW_S:
                    self._commits.popleft()
            case m.Retract(attempt):  # forgets this txid and every one above it
                with self._lock:
                    self.in_flight = {t: v for t, v in self.in_flight.items() if t < attempt.txid}
                self.last_stored = min(self.last_stored, attempt.txid - 1)
            case m.Cancel(attempt):
                with self._lock:
                    self.in_flight.pop(attempt.txid, None)
            case m.Drop(attempt, _, error, phase):
                self._failed(attempt.txid, error, phase.value, 1)
                self._dropped(attempt.txid, phase.value, f"{type(error).__name__}: {error}")
            case m.Skip(attempt):
                with self._lock:
                    self.in_flight.pop(attempt.txid, None)
                self.currtx = max(self.currtx, attempt.txid + 1)
            case m.Backoff(txid, error, phase, failures):
                self.retries += 1
                self._failed(txid, error, phase.value, failures)
            case m.Halt(reason, error, txid, phase, failures):
                self._failed(txid, error, phase.value if phase else reason.value, failures)
                self.publish()
                return
        self.maybe_publish()

    def on_measure(self, attempt: TransactionAttempt, step: str, seconds: float) -> None:
        # Called from the worker threads (emit, process, prepare): under the lock, and
        # only for a txid still in flight (a cancelled attempt may report late).
        with self._lock:
            if attempt.txid in self.in_flight and step in STEP_AFTER:
                self._set_step(attempt, STEP_AFTER[step], None)

    def _step(self, attempt: TransactionAttempt, step: str, number: int | None = None) -> None:
        """``attempt`` is now in ``step``; ``number``: which attempt of its txid this run
        makes (1, then 2 for its first retry), kept from the emit that said so."""
        with self._lock:
            self._set_step(attempt, step, number)

    def _set_step(self, attempt: TransactionAttempt, step: str, number: int | None) -> None:
        known = self.in_flight.get(attempt.txid, {})
        self.in_flight[attempt.txid] = {
            "txid": attempt.txid,
            "attempt": number if number is not None else known.get("attempt", 1),
            "step": step,
            "since": _now_iso(self.wall()),
        }

    def _failed(self, txid: int | None, error: BaseException, phase: str, failures: int) -> None:
        cause = type(error).__name__
        self.failures[cause] += 1
        self.last_error = {
            "txid": txid,
            "phase": phase,
            "failures": failures,
            "error": f"{cause}: {error}",
            "at": _now_iso(self.wall()),
        }

    def _dropped(self, txid: int, phase: str, why: str) -> None:
        self.dropped.append(
            {"txid": txid, "phase": phase, "error": why, "at": _now_iso(self.wall())}
        )

    # -- publishing --------------------------------------------------------------------

    def records_per_s(self) -> float:
        """Records committed per second over the last ``RATE_WINDOW_S`` seconds (or
        since the start, if the run is younger)."""
        wall = self.wall()
        window = min(RATE_WINDOW_S, max(wall - self.started_at, 1e-9))
        recent = sum(r for t, r in self._commits if t >= wall - RATE_WINDOW_S)
        return recent / window

    def document(self) -> dict[str, Any]:
        counts = self.counts
        return {
            "topology_id": self.topology_id,
            "running": self.stopped_at is None,
            "updated_at": _now_iso(self.wall()),
            "started_at": _now_iso(self.started_at),
            "leader": {**self.leader, "fence": self.fence()},
            "last_stored": self.last_stored,
            "last_committed": self.currtx - 1,
            "in_flight": self._in_flight(),
            "last_error": self.last_error,
            "guarantee": self.guarantee.value,
            "committed_txids": counts.committed_txids,
            "records": counts.records,
            "dropped_txids": counts.dropped_txids,
            "dropped_records": counts.dropped_records,
            "dropped": list(self.dropped),
            "records_per_s": round(self.records_per_s(), 1),
            "retries": self.retries,
            "failures": dict(self.failures),
            "lag": self.lag(),
            "batch_size": self.batch_size(),
        }

    def _in_flight(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(self.in_flight[t]) for t in sorted(self.in_flight)]

    def finish(self) -> None:
        """The run ends: say so in a last document."""
        self.stopped_at = self.wall()
        with self._lock:
            self.in_flight.clear()
        self.publish()

    def maybe_publish(self) -> None:
        if time.monotonic() - self._published >= self.interval_s:
            self.publish()

    def publish(self) -> None:
        self._published = time.monotonic()
        self.publish_to(self.document())
