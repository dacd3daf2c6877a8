"""The runner's status document (``transactional.runtime.status``), fed the messages a
run produces in the order a run produces them: the txids in flight and their steps,
the last error, the counts and the rate are what those messages say, and the document
is published at its interval and at the end; the records of earlier runs carried on;
and ``liveness``, what ``transactional status`` makes of a report given what the
store tells of the leadership."""

from __future__ import annotations

from typing import Any

import pytest

from transactional.errors import InjectedFault
from transactional.runtime import messages as m
from transactional.runtime.state import Counts
from transactional.runtime.status import Liveness, Status, liveness
from transactional.store import Leadership
from transactional.types import TransactionAttempt


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_the_document_follows_the_run() -> None:
    published: list[dict[str, Any]] = []
    counts = Counts()
    clock = Clock()
    status = Status(
        "orders",
        published.append,
        counts,
        lag=lambda: 42,
        batch_size=lambda: 1000,
        fence=lambda: 7,
        interval_s=3600,
        wall=clock,
    )
    five, six, seven = (TransactionAttempt(t, 100 + t) for t in (5, 6, 7))

    status.on_event(m.Opened(5, frozenset({5, 6})), 0)
    assert len(published) == 1  # the first event publishes: nothing was before
    status.on_command(m.Replay(five, 2), 0)
    status.on_command(m.Replay(six, 1), 0)
    status.on_measure(five, "emit", 0.5)
    status.on_event(m.Started(seven), 0)
    status.on_command(m.Emit(seven, 1), 0)
    status.on_command(m.Commit(five, 2, ((six, 1),)), 0)
    document = status.document()
    assert [(t["txid"], t["attempt"], t["step"]) for t in document["in_flight"]] == [
        (5, 2, "commit"),
        (6, 1, "commit"),
        (7, 1, "emit"),
    ]
    assert (document["last_stored"], document["last_committed"]) == (7, 4)

    clock.now += 30
    counts.committed_txids, counts.records = 2, 300
    status.on_command(m.Acknowledge(six, 1, 300, 0.0), 0)
    status.on_command(m.Backoff(7, InjectedFault("injected at emit"), m.Phase.START, 1, 9.0), 0)
    status.on_command(m.Retract(seven), 0)
    document = status.document()
    assert document["in_flight"] == [
        {"txid": 5, "attempt": 2, "step": "commit", "since": "2027-01-15T08:00:00+00:00"}
    ]
    assert (document["last_stored"], document["last_committed"]) == (6, 6)
    assert (document["committed_txids"], document["records"]) == (2, 300)
    assert document["records_per_s"] == 10.0  # 300 records in the run's 30 s
    assert (document["retries"], document["failures"]) == (1, {"InjectedFault": 1})
    assert document["last_error"] == {
        "txid": 7,
        "phase": "start",
        "failures": 1,
        "error": "InjectedFault: injected at emit",
        "at": "2027-01-15T08:00:30+00:00",
    }
    assert (document["lag"], document["batch_size"], document["leader"]["fence"]) == (42, 1000, 7)
    assert document["running"] is True

    status.finish()
    assert published[-1]["running"] is False and published[-1]["in_flight"] == []
    assert len(published) == 2  # the interval is an hour: only the first and the last


def test_the_rate_counts_the_last_minute_only() -> None:
    clock = Clock()
    status = Status("t", lambda d: None, Counts(), wall=clock)
    status.on_command(m.Acknowledge(TransactionAttempt(1, 1), 1, 6000, 0.0), 0)
    clock.now += 120
    status.on_command(m.Acknowledge(TransactionAttempt(2, 2), 1, 600, 0.0), 0)
    assert status.records_per_s() == 10.0  # 600 in the last 60 s; the 6000 are older


@pytest.mark.parametrize(
    ("previous", "currtx", "carried"),
    [
        (None, 1, (0, 0)),  # a new topology
        (None, 4, (0, 3)),  # txids 1..3 committed by runs that never reported
        # The last report was written after txid 3's commit: nothing missed.
        ({"records_total": 900, "uncounted_txids": 2, "last_committed": 3}, 4, (900, 2)),
        # Killed after committing txids 4 and 5 and before reporting them.
        ({"records_total": 900, "uncounted_txids": 2, "last_committed": 3}, 6, (900, 4)),
        # Rewound after the report: the rewound txids' records stay counted.
        ({"records_total": 900, "uncounted_txids": 0, "last_committed": 9}, 3, (900, 0)),
        # A report of an older version: its own run's records only.
        ({"records": 70, "last_committed": 2}, 3, (70, 0)),
        ("not a report", 2, (0, 1)),
    ],
)
def test_the_records_of_earlier_runs_are_carried_on(
    previous: Any, currtx: int, carried: tuple[int, int]
) -> None:
    published: list[dict[str, Any]] = []
    counts = Counts()
    status = Status("t", published.append, counts, previous=lambda: previous, wall=Clock())
    status.on_event(m.Opened(currtx, frozenset()), 0)
    counts.records = 40  # this run's, once it committed some
    status.on_command(m.Acknowledge(TransactionAttempt(currtx, 1), 1, 40, 0.0), 0)
    status.on_event(m.Opened(currtx + 1, frozenset()), 0)  # re-elected: carried once
    document = status.document()
    assert (document["records_total"], document["uncounted_txids"]) == (
        carried[0] + 40,
        carried[1],
    )
    assert document["records"] == 40 and document["interval_s"] == 2.0


def test_a_previous_report_that_cannot_be_read_carries_nothing() -> None:
    def unreadable() -> Any:
        raise OSError("store gone")

    status = Status("t", lambda d: None, Counts(), previous=unreadable, wall=Clock())
    status.on_event(m.Opened(1, frozenset()), 0)
    assert (status.document()["records_total"], status.document()["uncounted_txids"]) == (0, 0)


NOW = 1_800_000_000.0


def report(running: bool = True, age: float = 1.0, interval: float = 2.0, fence: int = 7) -> Any:
    """A report written ``age`` seconds before ``NOW`` (whole seconds, as reports are)."""
    from datetime import UTC, datetime

    written = datetime.fromtimestamp(NOW - age, UTC).isoformat(timespec="seconds")
    return {
        "running": running,
        "updated_at": written,
        "interval_s": interval,
        "leader": {"host": "h", "pid": 1, "fence": fence},
    }


LATE = "no report for 11 s, over the bound of 10 s"  # 5 intervals of 2 s
TAKEN = "another run, or a rewind, took the leadership after it"


@pytest.mark.parametrize(
    ("written", "leadership", "judged"),
    [
        (report(running=False), Leadership(held=True), (False, "it stopped")),
        (report(), Leadership(held=False, gone="the lock is free"), (False, "the lock is free")),
        (report(), Leadership(held=True, after_report=True), (False, TAKEN)),
        (report(fence=7), Leadership(held=True, token=8), (False, TAKEN)),
        (report(fence=7), Leadership(held=True, token=7), (True, "it holds the leadership")),
        (report(age=9), Leadership(), (True, "it reports")),
        (report(age=11), Leadership(), (False, LATE)),
        (
            report(age=11),
            Leadership(held=True),
            (True, f"it holds the leadership, but {LATE}: a long step, or stuck"),
        ),
        # 5 intervals of 1 s at the least: 5 s for a report every 0.2 s.
        (report(age=4, interval=0.2), Leadership(), (True, "it reports")),
        (
            report(age=6, interval=0.2),
            Leadership(),
            (False, "no report for 6 s, over the bound of 5 s"),
        ),
        # A report that does not say its interval: the default, 2 s.
        ({**report(age=11), "interval_s": None}, Leadership(), (False, LATE)),
    ],
)
def test_liveness_believes_a_report_only_while_its_runner_holds_the_leadership(
    written: Any, leadership: Leadership, judged: tuple[bool, str]
) -> None:
    running, why = judged
    since = None if running else written["updated_at"]
    assert liveness(written, leadership, NOW) == Liveness(running, why, since)
