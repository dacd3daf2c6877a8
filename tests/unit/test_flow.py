"""The adaptive batch size follows its rule exactly: add under target, subtract over it,
halve on failure, stay within bounds."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from pydantic import ValidationError

from transactional.config import RunnerConfig
from transactional.flow import HISTORY, AdaptiveBatchSize, BatchSizeConfig
from transactional.runner import TransactionalRunner
from transactional.testing import (
    InMemoryEngine,
    InMemoryStateStore,
    ListTransactionalSpout,
    MemoryCommitter,
    Range,
    counting_topology,
)
from transactional.types import CommitOutcome, TransactionAttempt


class SizedSpout(ListTransactionalSpout):
    """Sizes each new txid from the runner's adaptive batch size."""

    def open(self, context: Any) -> None:
        self.context = context

    def initialize_transaction(self, txid: int, prev_meta: Range | None) -> Range:
        start = prev_meta.end if prev_meta else 0
        size = self.context.batch_size(default=1)
        return Range(start=start, count=min(size, len(self.records) - start))


def test_grows_additively_under_target_and_never_exceeds_the_maximum() -> None:
    sizer = AdaptiveBatchSize(
        BatchSizeConfig(initial=100, step=50, maximum=260, target_latency_s=1)
    )
    assert [sizer.on_commit(0.5) for _ in range(5)] == [150, 200, 250, 260, 260]


def test_shrinks_by_a_step_when_slow_and_halves_on_failure_within_the_minimum() -> None:
    sizer = AdaptiveBatchSize(
        BatchSizeConfig(initial=1000, step=100, minimum=200, target_latency_s=1)
    )
    assert sizer.on_commit(2.0) == 900
    assert sizer.on_failure() == 450
    assert sizer.on_failure() == 225
    assert sizer.on_failure() == 200
    assert sizer.on_commit(0.1) == 300
    assert [kind for kind, _ in sizer.history] == ["slow", "fail", "fail", "fail", "grow"]


def test_history_keeps_only_the_latest_decisions() -> None:
    sizer = AdaptiveBatchSize(BatchSizeConfig(initial=10, minimum=1, step=1, maximum=10**6))
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
    # 10, then +10 per commit; txid 3 (size 30) fails once: its metadata is kept, and the
    # size halves to 15 before txid 3 commits and grows again.
    sizes = {a.txid: m.count for a, m in spout.emits}
    assert [sizes[t] for t in (1, 2, 3, 4)] == [10, 20, 30, 25]
    assert committer.counts == Counter(data)


def test_time_queued_behind_earlier_commits_does_not_shrink_the_batch() -> None:
    """With max_pending 4 and commits of a fixed 0.2 s, a txid that is processed at once
    waits up to 0.6 s for the three before it: 0.8 s end to end, over the 0.5 s target.
    A smaller batch cannot shorten that wait, so only the txid's own 0.2 s counts, and
    the size grows after every commit instead of spiralling down to the minimum."""

    class SlowCommitter(MemoryCommitter):
        def commit(self, attempt: TransactionAttempt, prepared: Any) -> CommitOutcome:
            time.sleep(0.2)
            return super().commit(attempt, prepared)

    data = [f"r{i % 7}" for i in range(10 * 12)]
    committer = SlowCommitter()
    sizer = AdaptiveBatchSize(
        BatchSizeConfig(initial=10, step=1, minimum=1, maximum=1000, target_latency_s=0.5)
    )
    runner = TransactionalRunner(
        counting_topology(SizedSpout(data, batch_size=1), committer),
        InMemoryStateStore(),
        config=RunnerConfig(topology_id="t", max_pending=4),
        engine=InMemoryEngine(),
        batch_size=sizer,
    )
    stats = runner.run(until_drained=True)
    assert stats.committed_txids >= 8
    assert [kind for kind, _ in sizer.history] == ["grow"] * stats.committed_txids
    assert committer.counts == Counter(data)
