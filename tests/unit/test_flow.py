"""The adaptive batch size follows its rule exactly: double once per round under target
until the first txid over it or a failure (slow start, which halves) or a doubling that
no longer raised the delivery rate by a quarter (which goes to the best size), then
probe a step up per round and go back when it did not pay, subtract over the target,
halve on failure, stay within bounds."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pydantic import ValidationError

from transactional.config import RunnerConfig
from transactional.flow import HISTORY, AdaptiveBatchSize, BatchSizeConfig
from transactional.runner import TransactionalRunner
from transactional.runtime import messages as m
from transactional.runtime.machine import Machine
from transactional.runtime.probes import RunStats, Timings
from transactional.testing import (
    InMemoryEngine,
    InMemoryStateStore,
    ListTransactionalSpout,
    MemoryCommitter,
    Range,
    counting_topology,
)
from transactional.types import TransactionAttempt as A


class SizedSpout(ListTransactionalSpout):
    """Sizes each new txid from the runner's adaptive batch size."""

    def open(self, context: Any) -> None:
        self.context = context

    def initialize_transaction(self, txid: int, prev_meta: Range | None) -> Range:
        start = prev_meta.end if prev_meta else 0
        size = self.context.batch_size(default=1)
        return Range(start=start, count=min(size, len(self.records) - start))


def test_slow_start_doubles_once_per_round_not_once_per_commit() -> None:
    sizer = AdaptiveBatchSize(BatchSizeConfig(initial=100, maximum=10_000, target_latency_s=10))
    # Three txids were decided in round 0 (at 100) before the first commit (max_pending 3).
    assert sizer.round == 0
    assert sizer.on_commit(1.0, records=100, round=0, at=1.0) == 200
    assert sizer.round == 1
    assert sizer.on_commit(1.0, records=100, round=0, at=1.1) == 200  # not a test of 200
    assert sizer.on_commit(1.0, records=100, round=0, at=1.2) == 200
    assert sizer.on_commit(1.5, records=200, round=1, at=2.5) == 400
    assert [k for k, _ in sizer.history] == ["start", "hold", "hold", "start"]
    # Round 0 delivered its 300 records from its first txid's start (0.0) to 1.2 s.
    assert sizer.rates() == [(300 / 1.2, 100)]


def test_slow_start_ends_where_the_delivery_rate_stops_rising_at_the_best_size() -> None:
    """One txid per round (max_pending 1); each round is timed from the commit before
    it. A doubling that raised records per second by less than a quarter ends slow
    start, and the size goes to the smallest that delivered within 5% of the best."""
    sizer = AdaptiveBatchSize(
        BatchSizeConfig(initial=100, step=50, maximum=10_000, target_latency_s=10)
    )
    commits = [  # (records, commit time): rates 100/s, 200/s, 400/1.8 = 222/s, ...
        (100, 1.0),
        (200, 2.0),
        (400, 3.8),
        (800, 7.3),  # completes round 2 at 222/s: under 1.25 x 200/s
    ]
    sizes = [sizer.on_commit(1.0, records=n, round=sizer.round, at=t) for n, t in commits]
    assert sizes == [200, 400, 800, 400]
    assert [k for k, _ in sizer.history] == ["start"] * 3 + ["plateau"]
    assert [round(r) for r, _ in sizer.rates()] == [100, 200, 222]
    # Then at each round: a probe a step above the cruise size, or back to it. Each
    # commit completes the round before it: round 3 (800 in 3.5 s: 229/s) is the best,
    # and 400 delivered within 5% of it: cruise at 400, so probe 450.
    assert sizer.on_commit(1.0, records=400, round=sizer.round, at=9.1) == 450
    assert [round(r) for r, _ in sizer.rates()][-1] == 229
    # Round 4 (400 at 222/s) changes nothing: back to the cruise size.
    assert sizer.on_commit(1.0, records=450, round=sizer.round, at=11.1) == 400
    # Round 5, the probe (450 in 2.0 s: 225/s), was not 5% better: probe again.
    assert sizer.on_commit(1.0, records=400, round=sizer.round, at=12.6) == 450
    # Round 6 (400 in 1.5 s: 267/s) is the new best, at 400: back to it.
    assert sizer.on_commit(1.0, records=450, round=sizer.round, at=13.9) == 400
    # Round 7, the probe (450 in 1.3 s: 346/s), delivered more than 5% better: it is
    # the cruise size now.
    assert sizer.on_commit(1.0, records=400, round=sizer.round, at=14.5) == 450
    assert [k for k, _ in sizer.history][4:] == ["grow", "back", "grow", "back", "grow"]
    # A txid over the target still ends slow start by halving, as before.
    over = AdaptiveBatchSize(
        BatchSizeConfig(initial=100, minimum=10, maximum=10_000, target_latency_s=1)
    )
    assert over.on_commit(2.0, records=100, round=0, at=2.0) == 50


def test_a_slow_round_is_answered_once() -> None:
    """Several txids of one round over the target shrink the size once; sizes at or
    above the slow one are no longer cruise sizes."""
    sizer = AdaptiveBatchSize(
        BatchSizeConfig(initial=1000, step=100, minimum=10, target_latency_s=1, slow_start=False)
    )
    assert sizer.on_commit(0.5, records=1000, round=0, at=1.0) == 1100  # round 1
    assert sizer.on_commit(2.0, records=1100, round=1, at=3.0) == 1000  # slow
    assert sizer.on_commit(2.0, records=1100, round=1, at=5.0) == 1000  # same round: hold
    assert sizer.on_commit(2.0, records=1000, round=2, at=7.0) == 900  # a new round, slow
    assert [k for k, _ in sizer.history] == ["grow", "slow", "hold", "slow"]
    assert all(size < 1000 for _, size in sizer.rates())


def test_grows_additively_under_target_and_never_exceeds_the_maximum() -> None:
    sizer = AdaptiveBatchSize(
        BatchSizeConfig(initial=100, step=50, maximum=260, target_latency_s=1, slow_start=False)
    )
    assert [sizer.on_commit(0.5) for _ in range(5)] == [150, 200, 250, 260, 260]


def test_slow_start_doubles_until_the_first_slow_txid_then_grows_additively() -> None:
    sizer = AdaptiveBatchSize(
        BatchSizeConfig(initial=100, step=50, minimum=10, maximum=10_000, target_latency_s=1)
    )
    doubled = [sizer.on_commit(0.5) for _ in range(4)]
    assert doubled == [200, 400, 800, 1600]
    assert sizer.on_commit(1.5) == 800  # over the target: slow start ends, halved
    assert [sizer.on_commit(0.5) for _ in range(2)] == [850, 900]  # then additive
    assert sizer.on_commit(1.5) == 850  # and a step down, not a halving
    assert [k for k, _ in sizer.history] == ["start"] * 4 + ["slow", "grow", "grow", "slow"]
    capped = AdaptiveBatchSize(BatchSizeConfig(initial=300, maximum=1000, target_latency_s=1))
    assert [capped.on_commit(0.1) for _ in range(3)] == [600, 1000, 1000]


def test_a_failure_ends_slow_start() -> None:
    sizer = AdaptiveBatchSize(BatchSizeConfig(initial=100, step=10, minimum=10, target_latency_s=1))
    assert sizer.on_commit(0.5) == 200
    assert sizer.on_failure() == 100
    assert [sizer.on_commit(0.5) for _ in range(2)] == [110, 120]


def test_shrinks_by_a_step_when_slow_and_halves_on_failure_within_the_minimum() -> None:
    sizer = AdaptiveBatchSize(
        BatchSizeConfig(initial=1000, step=100, minimum=200, target_latency_s=1, slow_start=False)
    )
    assert sizer.on_commit(2.0) == 900
    assert sizer.on_failure() == 450
    assert sizer.on_failure() == 225
    assert sizer.on_failure() == 200
    assert sizer.on_commit(0.1) == 300
    assert [kind for kind, _ in sizer.history] == ["slow", "fail", "fail", "fail", "grow"]


def test_history_keeps_only_the_latest_decisions() -> None:
    sizer = AdaptiveBatchSize(
        BatchSizeConfig(initial=10, minimum=1, step=1, maximum=10**6, slow_start=False)
    )
    for _ in range(HISTORY + 5):
        sizer.on_commit(0.0)
    assert len(sizer.history) == HISTORY
    # Sizes after each decision run 11, 12, ...; the first five have been dropped.
    assert sizer.history[0] == ("grow", 16)
    assert sizer.history[-1] == ("grow", 10 + HISTORY + 5)


def test_bad_bounds_are_refused_with_the_rule() -> None:
    with pytest.raises(ValidationError, match="minimum <= initial <= maximum"):
        BatchSizeConfig(initial=10, minimum=100)


def test_the_runner_feeds_the_size_and_new_txids_use_it() -> None:
    from transactional.faults import FaultPoint
    from transactional.testing import FaultPlan, FaultRule

    data = [f"r{i % 5}" for i in range(100)]
    spout = SizedSpout(data, batch_size=1)
    committer = MemoryCommitter()
    sizer = AdaptiveBatchSize(BatchSizeConfig(initial=10, step=10, minimum=5, target_latency_s=60))
    topology = counting_topology(spout, committer)
    runner = TransactionalRunner(
        topology,
        InMemoryStateStore(),
        config=RunnerConfig(topology_id="t", max_pending=1, backoff_initial_s=0, backoff_max_s=0),
        engine=InMemoryEngine(),
        faults=FaultPlan([FaultRule(FaultPoint.PROCESS, 3)]),
        batch_size=sizer,
    )
    runner.run(until_drained=True)
    # 10, doubled per commit (slow start); txid 3 (size 40) fails once: its metadata is
    # kept and the size halves to 20 (slow start ends). Txid 3's commit is of the round
    # before the failure, which says nothing of 20: txid 4 takes 20; the last 10 remain.
    sizes = {a.txid: m.count for a, m in spout.emits}
    assert sorted(sizes.items()) == [(1, 10), (2, 20), (3, 40), (4, 20), (5, 10)]
    assert [k for k, _ in sizer.history][:4] == ["start", "start", "fail", "hold"]
    assert committer.counts == Counter(data)


def test_time_queued_behind_earlier_commits_does_not_shrink_the_batch() -> None:
    """With max_pending 4 and commits of 0.2 s, a txid that is processed at once waits
    up to 0.6 s for the three before it: 0.8 s end to end, over the 0.5 s target. A
    smaller batch cannot shorten that wait, so only the txid's own 0.2 s counts, and
    the size grows after every commit instead of spiralling down to the minimum.

    A schedule, not a timed run: the runtime's machine and its timing probe are given
    the events a runner would meet, at the times they would meet them."""
    sizer = AdaptiveBatchSize(
        BatchSizeConfig(
            initial=10, step=1, minimum=1, maximum=1000, target_latency_s=0.5, slow_start=False
        )
    )
    stats = RunStats()
    timings = Timings(stats, sizer)
    machine = Machine(
        RunnerConfig(
            topology_id="t",
            max_pending=4,
            max_attempts=3,
            attempt_timeout_s=None,
            backoff_initial_s=0.1,
            backoff_max_s=1.0,
            poll_interval_s=1.0,
            poll_max_s=1.0,
            max_reelections=0,
        )
    )
    commits: list[m.Commit] = []

    def step(event: m.Event, now: float) -> None:
        timings.on_event(event, now)
        for command in machine.step(event, now):
            timings.on_command(command, now)
            if isinstance(command, m.Emit) and command.attempt.txid > 4:
                step(m.NotReady(command.attempt.txid), now)  # four txids, then idle
            elif isinstance(command, m.Emit):
                step(m.Started(command.attempt), now)
            elif isinstance(command, m.Verify):
                step(m.Verified(command.attempt), now)
            elif isinstance(command, m.Commit):
                commits.append(command)

    step(m.Opened(1, frozenset()), 0.0)
    for txid in (4, 3, 2, 1):  # all four processed at once, at time 0
        step(m.Processed(A(txid, txid), 10, empty=False), 0.0)
    for k in (1, 2, 3, 4):  # then committed one after the other, 0.2 s each
        (commit,) = commits
        commits.clear()
        assert commit.attempt.txid == k
        step(m.CommitBegan(commit.attempt), 0.2 * (k - 1))
        step(m.Committed(commit.attempt), 0.2 * k)
        step(m.Advanced(commit.attempt), 0.2 * k)

    # Queued 0, 0.2, 0.4 and 0.6 s: each txid's own latency is its 0.2 s commit.
    assert [round(t.latency_s or 0, 9) for t in stats.timings] == [0.2] * 4
    # Not a "slow" among them: the first commit grows the size, the rest are of the
    # same round (decided before that decision) and hold it.
    assert [kind for kind, _ in sizer.history] == ["grow", "hold", "hold", "hold"]
