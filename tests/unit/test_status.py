"""The runner's status document (``transactional.runtime.status``), fed the messages a
run produces in the order a run produces them: the txids in flight and their steps,
the last error, the counts and the rate are what those messages say, and the document
is published at its interval and at the end."""

from __future__ import annotations

from typing import Any

from transactional.errors import InjectedFault
from transactional.runtime import messages as m
from transactional.runtime.state import Counts
from transactional.runtime.status import Status
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
