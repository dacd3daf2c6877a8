"""Commit groups (``max_group``) through the whole runner, on in-memory doubles: which
txids go together, that a group is recorded before any sink sees it, and that after a
crash the replay commits exactly that group again, whatever the new settings, with the
sink exact. Each test checks the sink against counts computed from the records."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from transactional.faults import FaultPoint
from transactional.testing import (
    FaultPlan,
    FaultRule,
    InMemoryEngine,
    InMemoryStateStore,
    ListOpaqueSpout,
    ListTransactionalSpout,
    MemoryCommitter,
    TopologyHarness,
    counting_topology,
)
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

RECORDS = [f"r{i % 7}" for i in range(50)]  # batches of 10: txids 1..5


class HoldsFirstCommit(MemoryCommitter):
    """Commits txid 1 only once txids 2, 3 and 4 are prepared, so that they wait
    together behind it (once: a rerun does not wait)."""

    def __init__(self, mode: CommitMode = CommitMode.TRANSACTIONAL) -> None:
        super().__init__(mode)
        self.behind = threading.Event()

    def prepare(self, attempt: TransactionAttempt, inputs: Any) -> Any:
        prepared = super().prepare(attempt, inputs)
        if {2, 3, 4} <= {a.txid for a in self.prepared}:
            self.behind.set()
        return prepared

    def commit_group(
        self, attempts: Sequence[TransactionAttempt], prepared: Sequence[Any]
    ) -> CommitOutcome:
        if attempts[0].txid == 1:
            assert self.behind.wait(30), "txids 2..4 were never prepared"
        return super().commit_group(attempts, prepared)


def harness(spout: Any, committer: MemoryCommitter, store: InMemoryStateStore) -> TopologyHarness:
    return TopologyHarness(
        lambda: counting_topology(spout, committer), store=store, engine=InMemoryEngine()
    )


def test_txids_processed_behind_a_commit_are_recorded_then_committed_as_one_group() -> None:
    committer, store = HoldsFirstCommit(), InMemoryStateStore()
    run = harness(ListTransactionalSpout(RECORDS, 10), committer, store).run_until_drained(
        max_pending=4, max_group=8
    )
    # txid 1 alone (the first commit after opening), then 2..4 together, then 5.
    assert committer.spans == [(1, 1), (2, 4), (5, 5)]
    assert store.groups == [(2, 4)]  # recorded before the sink saw it
    assert store.advances == [1, 4, 5]
    assert committer.counts == Counter(RECORDS)
    assert run.stats.committed_txids == 5 and run.stats.grouped_commits == 1
    assert run.stats.records == len(RECORDS)


def test_max_group_bounds_a_group() -> None:
    committer, store = HoldsFirstCommit(), InMemoryStateStore()
    harness(ListTransactionalSpout(RECORDS, 10), committer, store).run_until_drained(
        max_pending=4, max_group=2
    )
    assert committer.spans[:2] == [(1, 1), (2, 3)]
    assert all(last - first < 2 for first, last in committer.spans)
    assert committer.committed_sequence() == [1, 2, 3, 4, 5]
    assert committer.counts == Counter(RECORDS)


def test_a_crash_after_the_group_was_written_replays_exactly_that_group() -> None:
    committer, store = HoldsFirstCommit(), InMemoryStateStore()
    h = harness(ListTransactionalSpout(RECORDS, 10), committer, store)
    # The process dies after the sink took 2..4, before the store advanced past it.
    crash = FaultPlan([FaultRule(FaultPoint.AFTER_SINK_WRITE, 3, crash=True)])
    assert h.run_until_drained(crash, max_pending=4, max_group=8).crashed
    assert committer.spans == [(1, 1), (2, 4)] and store.currtx == 2 and store.group == (2, 4)
    # Restarted with settings that would never group 2..4: the recorded group rules.
    h.run_until_drained(max_pending=1, max_group=1)
    assert committer.spans[2:] == [(2, 4), (5, 5)]
    assert [o for _, o in committer.calls[2:]] == [CommitOutcome.SKIPPED, CommitOutcome.APPLIED]
    assert committer.counts == Counter(RECORDS)
    assert store.currtx == 6


def slices(records: list[str], size: int) -> list[list[str]]:
    return [records[i : i + size] for i in range(0, len(records), size)]


def test_an_opaque_group_replayed_with_other_records_is_undone_and_applied_again() -> None:
    # txid 3's first emission holds a record that no later emission has; txid 4's replay
    # comes out empty and stays in its group (committed, not retracted).
    emitted: Counter[int] = Counter()

    def source(attempt: TransactionAttempt, partition: int, rows: list[Any]) -> list[Any]:
        emitted[attempt.txid] += 1
        if attempt.txid == 3 and emitted[3] == 1:
            return [*rows, "ghost"]
        if attempt.txid == 4 and emitted[4] > 1:
            return []
        return rows

    committer, store = HoldsFirstCommit(CommitMode.OPAQUE), InMemoryStateStore()
    h = harness(ListOpaqueSpout([RECORDS], 10, source), committer, store)
    crash = FaultPlan([FaultRule(FaultPoint.AFTER_SINK_WRITE, 4, crash=True)])
    assert h.run_until_drained(crash, max_pending=4, max_group=8).crashed
    assert committer.spans == [(1, 1), (2, 4)] and committer.counts["ghost"] == 1
    h.run_until_drained(max_pending=4, max_group=8)
    assert committer.spans[2] == (2, 4)
    assert committer.calls[2][1] is CommitOutcome.REAPPLIED
    assert store.retracted == []
    # What the sink must hold: every txid's last emission, txid 4's being empty.
    batches = slices(RECORDS, 10)
    assert committer.counts == Counter([r for i, b in enumerate(batches, 1) if i != 4 for r in b])
