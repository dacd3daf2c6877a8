"""The adaptive batch size follows its rule exactly: double once per round under target
until the first txid over it or a failure (slow start, which halves) or a doubling that
no longer raised the records per second by a quarter (which keeps the size), then add
under target, subtract over it, halve on failure, stay within bounds."""

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
    # Three txids were decided at 100 before the first commit (max_pending 3).
    assert sizer.on_commit(1.0, records=100, size=100) == 200
    assert sizer.on_commit(1.0, records=100, size=100) == 200  # not a test of 200
    assert sizer.on_commit(1.0, records=100, size=100) == 200
    assert sizer.on_commit(1.5, records=200, size=200) == 400  # 133/s >= 1.25 x 100/s
    assert [k for k, _ in sizer.history] == ["start", "hold", "hold", "start"]


def test_slow_start_ends_where_doubling_stops_paying_and_keeps_the_size() -> None:
    sizer = AdaptiveBatchSize(
        BatchSizeConfig(initial=100, step=10, maximum=10_000, target_latency_s=10)
    )
    assert sizer.on_commit(1.0, records=100, size=100) == 200  # 100 records/s
    assert sizer.on_commit(1.7, records=200, size=200) == 200  # 118/s: under 125/s
    assert sizer.on_commit(1.7, records=200, size=200) == 210  # then additive
    assert [k for k, _ in sizer.history] == ["start", "plateau", "grow"]
    # A txid over the target still ends slow start by halving, as before.
    over = AdaptiveBatchSize(
        BatchSizeConfig(initial=100, minimum=10, maximum=10_000, target_latency_s=1)
    )
    assert over.on_commit(2.0, records=100, size=100) == 50


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
    # kept, the size halves to 20 and slow start ends, so after txid 3 commits: +10.
    sizes = {a.txid: m.count for a, m in spout.emits}
    assert sorted(sizes.items()) == [(1, 10), (2, 20), (3, 40), (4, 30)]  # 100 records
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
    assert [kind for kind, _ in sizer.history] == ["grow"] * 4
