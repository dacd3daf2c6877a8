"""The demo's progress line: records, rate and, where the spout can tell, its lag."""

from __future__ import annotations

import io

from transactional.cli.progress import ProgressListener


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_status_line_shows_the_rate_and_the_sources_lag() -> None:
    clock, out = Clock(), io.StringIO()
    lag = [7_000]
    listener = ProgressListener(out, interval_s=10, clock=clock, live=False, lag=lambda: lag[0])
    clock.now += 4
    listener.on_commit(1, 2_000)  # not yet a line: under the interval
    assert out.getvalue() == ""
    clock.now += 6
    lag[0] = 5_000
    listener.on_commit(2, 3_000)
    assert out.getvalue().splitlines() == [
        "progress committed_txids=2 last_txid=2 records=5000 records_per_s=500 "
        "elapsed_s=10 lag=5000 guarantee=exactly_once"
    ]


def test_the_status_line_shows_the_guarantee_and_what_at_most_once_dropped() -> None:
    clock, out = Clock(), io.StringIO()
    listener = ProgressListener(
        out, interval_s=10, clock=clock, live=False, guarantee="at_most_once"
    )
    listener.on_commit(1, 40)
    listener.on_drop(2, 25)  # processed, then its commit failed
    listener.on_drop(3, None)  # failed before it was counted
    clock.now += 10
    listener.on_commit(4, 35)
    assert out.getvalue().splitlines() == [
        "progress committed_txids=2 last_txid=4 records=75 records_per_s=8 elapsed_s=10 "
        "guarantee=at_most_once dropped_txids=2 dropped_records=25"
    ]


def test_a_spout_that_cannot_tell_its_lag_shows_none() -> None:
    clock = Clock()
    listener = ProgressListener(io.StringIO(), clock=clock, live=False)
    clock.now += 2
    listener.on_commit(1, 10)
    assert "lag" not in listener.status()
    assert listener.status().startswith("progress committed_txids=1 last_txid=1 records=10 ")
