"""What an operator sees of a running topology: the runner's status document.

``Status`` is a probe: it watches the machine's commands and the executor's timings
(the txids in flight, the step each is in, the last error, the commits and their
records) and, every ``interval_s`` and when the run ends, publishes a JSON document to
the state store (``StateStore.publish_status``) from the runner's own thread, where
every store call is made. ``transactional status`` reads it back with the store's
state and each sink's marker.

The document is a report, not part of the protocol: it is written without the fence
(a deposed runner's last report may stand until the new leader's first), and nothing
reads it to decide anything. A killed runner's last report still says it runs:
``liveness`` judges it by what its store tells of the leadership now.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from transactional.runtime import messages as m
from transactional.runtime.probes import Probe
from transactional.runtime.state import Counts
from transactional.store import JsonValue, Leadership
from transactional.types import Guarantee, TransactionAttempt

__all__ = [
    "RATE_WINDOW_S",
    "STALE_INTERVALS",
    "STEP_AFTER",
    "STOPPED",
    "Liveness",
    "Status",
    "liveness",
    "stale_after_s",
]

#: The latest dropped txids a status document lists (``at_most_once``).
DROPPED_SHOWN = 20
#: Records per second are measured over the commits of this many last seconds.
RATE_WINDOW_S = 60.0
#: A runner reports at least once a status interval while its thread turns (once a
#: second at the least); a report older than this many intervals (of 1 s at the least)
#: is late (``liveness``).
STALE_INTERVALS = 5
#: ``Liveness.why`` of a runner whose last report says it stopped.
STOPPED = "it stopped"
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


def _nothing() -> Any:
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
    #: The last report of an earlier run (``StateStore.read_status``), read once: its
    #: topology's totals are carried on.
    previous: Callable[[], JsonValue | None] = _nothing
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
    #: The topology's records committed by earlier runs, as their reports counted them,
    #: and how many committed txids no report counted (None: not known before Opened).
    carried: tuple[int, int] | None = field(init=False, default=None)
    _commits: deque[tuple[float, int]] = field(init=False, default_factory=deque)
    _published: float = field(init=False, default=float("-inf"))
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.started_at = self.wall()
        try:
            self._previous = self.previous()
        except Exception:  # a report is best effort: the totals start here
            self._previous = None

    def _carry(self, currtx: int) -> None:
        """At the run's first ``Opened``: the earlier runs' record total, and the txids
        committed after their last report (a killed run's last few, or a run's that did
        not report), whose records no report counted."""
        before = self._previous if isinstance(self._previous, dict) else {}
        figures = [
            before.get("records_total", before.get("records", 0)),
            before.get("uncounted_txids", 0),
            before.get("last_committed", 0),
        ]
        total, uncounted, reported = (v if isinstance(v, int) else 0 for v in figures)
        self.carried = (total, uncounted + max(0, currtx - 1 - reported))

    # -- watching ----------------------------------------------------------------------

    def on_event(self, event: m.Event, now: float) -> None:
        if isinstance(event, m.Opened):
            if self.carried is None:
                self._carry(event.currtx)
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
        total, uncounted = self.carried or (0, 0)
        return {
            "topology_id": self.topology_id,
            "running": self.stopped_at is None,
            "updated_at": _now_iso(self.wall()),
            "interval_s": self.interval_s,
            "started_at": _now_iso(self.started_at),
            "leader": {**self.leader, "fence": self.fence()},
            "last_stored": self.last_stored,
            "last_committed": self.currtx - 1,
            "in_flight": self._in_flight(),
            "last_error": self.last_error,
            "guarantee": self.guarantee.value,
            "committed_txids": counts.committed_txids,
            "records": counts.records,
            "records_total": total + counts.records,
            "uncounted_txids": uncounted,
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


@dataclass(frozen=True)
class Liveness:
    """Whether the runner behind a report runs (``liveness``)."""

    running: bool
    #: What shows it, for a person.
    why: str
    #: A runner not running: its last sign of life, its last report's time.
    since: str | None = None


def stale_after_s(report: Mapping[str, Any]) -> float:
    """How old a running runner's report may grow: ``STALE_INTERVALS`` of its status
    interval (2 s when the report does not say)."""
    interval = report.get("interval_s")
    interval = interval if isinstance(interval, int | float) and interval > 0 else 2.0
    return STALE_INTERVALS * max(float(interval), 1.0)


def liveness(report: Mapping[str, Any], leadership: Leadership, now: float) -> Liveness:
    """Whether the runner that wrote ``report`` still runs, judged at wall time ``now``
    by what its store tells of the leadership: the one place ``transactional status``
    decides it, for every output and every store. A report that says it runs is
    believed only while its runner holds the leadership it was written under (a killed
    runner's lock, or ZooKeeper session, goes with it); where the store cannot tell,
    only while it is not older than ``stale_after_s``."""
    since = report.get("updated_at")
    if not report.get("running"):
        return Liveness(False, STOPPED, since)
    if leadership.held is False:
        return Liveness(False, leadership.gone, since)
    fence = (report.get("leader") or {}).get("fence")
    earlier = leadership.token is not None and isinstance(fence, int) and fence < leadership.token
    if leadership.after_report or earlier:
        return Liveness(False, "another run, or a rewind, took the leadership after it", since)
    age = _age(since, now)
    bound = stale_after_s(report)
    if age is None or age <= bound:
        return Liveness(True, "it holds the leadership" if leadership.held else "it reports")
    silent = f"no report for {age:.0f} s, over the bound of {bound:g} s"
    if leadership.held is None:
        return Liveness(False, silent, since)
    return Liveness(True, f"it holds the leadership, but {silent}: a long step, or stuck")


def _age(iso: Any, now: float) -> float | None:
    """Seconds from the time ``iso`` (a report's) to ``now`` (None: not a time)."""
    try:
        return now - datetime.fromisoformat(iso).timestamp()
    except (TypeError, ValueError):
        return None
