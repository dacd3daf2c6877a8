"""The runner's state machine, one behaviour per test, on in-memory doubles.

Every test ends by checking the sink against ``Counter(records)``: each record
counted exactly once, whatever happened on the way.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from transactional.config import RunnerConfig
from transactional.errors import InjectedFault, PoisonBatchError
from transactional.faults import FaultPoint
from transactional.runner import TransactionalRunner
from transactional.testing import (
    FaultPlan,
    FaultRule,
    InMemoryEngine,
    InMemoryStateStore,
    ListOpaqueSpout,
    ListPartitionedSpout,
    ListTransactionalSpout,
    MemoryCommitter,
    Range,
    counting_topology,
)
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt


def make_runner(
    spout: Any,
    committer: MemoryCommitter,
    store: InMemoryStateStore | None = None,
    faults: FaultPlan | None = None,
    listener: Any = None,
    **config: Any,
) -> TransactionalRunner:
    topology = counting_topology(spout, committer)
    settings: dict[str, Any] = {
        "topology_id": "t",
        "max_pending": 3,
        "max_group": 1,  # each txid alone: these tests follow single commits
        "backoff_initial_s": 0.0,
        "backoff_max_s": 0.0,
        "poll_interval_s": 0.01,
        "attempt_timeout_s": 30.0,
    }
    settings.update(config)
    return TransactionalRunner(
        topology,
        store or InMemoryStateStore(),
        config=RunnerConfig(**settings),
        engine=InMemoryEngine(),
        faults=faults,
        listener=listener,
    )


def records(n: int) -> list[str]:
    return [f"r{i % 7}" for i in range(n)]


class OverlappingSpout(ListTransactionalSpout):
    """Tracks how many emits run at once. The emits of the first ``together`` txids
    wait for each other at a barrier, so they provably run at the same time (a runner
    that ran fewer at once would break the barrier), with no sleep and no timing."""

    def __init__(self, data: list[Any], batch_size: int, together: int) -> None:
        super().__init__(data, batch_size)
        self.gate = threading.Barrier(together)
        self.running = 0
        self.max_running = 0
        self.lock = threading.Lock()

    def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> list[Any]:
        with self.lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        if attempt.txid <= self.gate.parties:
            self.gate.wait(timeout=30)  # raises BrokenBarrierError if they never meet
        with self.lock:
            self.running -= 1
        return super().emit_batch(attempt, meta)


def test_never_more_than_max_pending_and_window_starts_at_currtx() -> None:
    data = records(60)
    spout = OverlappingSpout(data, batch_size=5, together=3)
    store = InMemoryStateStore()
    committer = MemoryCommitter()
    windows: list[tuple[int, int]] = []
    original = spout.initialize_transaction

    def watched(txid: int, prev: Range | None) -> Range:
        windows.append((txid, store.currtx))
        return original(txid, prev)

    spout.initialize_transaction = watched  # type: ignore[method-assign]
    stats = make_runner(spout, committer, store, max_pending=3).run(until_drained=True)

    assert stats.failures == 0  # the barrier held: three emits ran at once
    assert spout.max_running == 3
    assert all(currtx <= txid < currtx + 3 for txid, currtx in windows)
    assert committer.counts == Counter(data)


def test_a_txid_processed_early_waits_for_every_lower_txid() -> None:
    data = records(30)
    second_prepared = threading.Event()

    class FirstWaits(ListTransactionalSpout):
        def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> list[Any]:
            if attempt.txid == 1 and not any(a.txid == 1 for a, _ in self.emits):
                assert second_prepared.wait(30), "txid 2 was never processed"
            return super().emit_batch(attempt, meta)

    class Watching(MemoryCommitter):
        def prepare(self, attempt: TransactionAttempt, inputs: Any) -> Any:
            prepared = super().prepare(attempt, inputs)
            if attempt.txid == 2:
                second_prepared.set()
            return prepared

    committer = Watching()
    stats = make_runner(FirstWaits(data, 10), committer, max_pending=3).run(until_drained=True)
    assert stats.failures == 0

    prepared = [a.txid for a in committer.prepared]
    assert prepared.index(2) < prepared.index(1)  # 2 finished processing first...
    assert committer.committed_sequence() == [1, 2, 3]  # ...but committed after 1
    assert committer.counts == Counter(data)


def test_commit_advances_currtx_and_keeps_only_the_committed_txids_metadata() -> None:
    data = records(40)
    store = InMemoryStateStore()
    seen: list[tuple[int, int, list[int]]] = []

    class Listener:
        def on_commit(self, txid: int, records: int) -> None:
            seen.append((txid, store.currtx, sorted(store.metas)))

    committer = MemoryCommitter()
    make_runner(
        ListTransactionalSpout(data, 10), committer, store, listener=Listener(), max_pending=1
    ).run(until_drained=True)

    assert [(t, c) for t, c, _ in seen] == [(1, 2), (2, 3), (3, 4), (4, 5)]
    assert [metas for _, _, metas in seen] == [[1], [2], [3], [4]]
    assert store.advances == [1, 2, 3, 4]
    assert committer.counts == Counter(data)


def test_processing_failure_reruns_the_txid_and_all_above_with_new_attempts_same_meta() -> None:
    data = records(50)
    third_emitted = threading.Event()

    class Spout(ListTransactionalSpout):
        def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> list[Any]:
            if attempt.txid == 3:
                third_emitted.set()
            if attempt.txid == 2:
                third_emitted.wait(5)  # txid 3 is surely in flight when 2 fails
            return super().emit_batch(attempt, meta)

    spout = Spout(data, 10)
    committer = MemoryCommitter()
    faults = FaultPlan([FaultRule(FaultPoint.PROCESS, 2)])
    make_runner(spout, committer, faults=faults, max_pending=3).run(until_drained=True)

    by_txid: dict[int, list[tuple[int, Range]]] = {}
    for attempt, meta in spout.emits:
        by_txid.setdefault(attempt.txid, []).append((attempt.attempt_id, meta))
    for txid in (2, 3):
        attempts = by_txid[txid]
        assert len(attempts) == 2
        assert attempts[0][0] != attempts[1][0]
        assert attempts[0][1] == attempts[1][1]
    assert len(by_txid[1]) == 1
    assert spout.failed[:2] == [2, 3]
    assert committer.committed_sequence() == [1, 2, 3, 4, 5]
    assert committer.counts == Counter(data)


def test_commit_failure_reprocesses_and_recommits_the_txid() -> None:
    data = records(30)
    failed = []

    def fail_once(attempt: TransactionAttempt) -> bool:
        if attempt.txid == 2 and not failed:
            failed.append(attempt)
            return True
        return False

    spout = ListTransactionalSpout(data, 10)
    committer = MemoryCommitter(fail=fail_once)
    make_runner(spout, committer).run(until_drained=True)

    commits_of_2 = [(a, o) for a, o in committer.calls if a.txid == 2]
    assert len(commits_of_2) == 2
    assert commits_of_2[0][1] is None and commits_of_2[1][1] is CommitOutcome.APPLIED
    assert commits_of_2[0][0] != commits_of_2[1][0]
    assert [a.txid for a in committer.prepared].count(2) == 2
    assert committer.counts == Counter(data)


def test_new_txids_wait_for_is_ready_and_replays_do_not_ask() -> None:
    data: list[str] = []
    spout = ListTransactionalSpout(data, 5)
    committer = MemoryCommitter()
    faults = FaultPlan([FaultRule(FaultPoint.PROCESS, 2)])
    runner = make_runner(spout, committer, faults=faults, max_pending=1)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while len(spout.ready_calls) < 2:  # asked, refused, and asked again: waiting
            assert time.monotonic() < deadline, "is_ready was never asked twice"
            time.sleep(0.005)
        assert spout.init_calls == []
        data.extend(records(15))
        deadline = time.monotonic() + 5
        while committer.last_txid < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        runner.stop()
        thread.join(5)
    assert committer.counts == Counter(data)
    emitted_2 = [a for a, _ in spout.emits if a.txid == 2]
    assert len(emitted_2) == 2  # replayed once...
    assert spout.ready_calls.count(2) == 1  # ...without asking is_ready again


def test_initialize_transaction_runs_once_per_txid_with_the_previous_metadata() -> None:
    data = records(60)
    spout = ListTransactionalSpout(data, 10)
    faults = FaultPlan([FaultRule(FaultPoint.EMIT, 2), FaultRule(FaultPoint.AFTER_SINK_WRITE, 4)])
    committer = MemoryCommitter()
    make_runner(spout, committer, faults=faults).run(until_drained=True)

    txids = [t for t, _ in spout.init_calls]
    assert txids == [1, 2, 3, 4, 5, 6]
    metas = {a.txid: m for a, m in spout.emits}
    assert spout.init_calls[0][1] is None
    assert all(prev == metas[t - 1] for t, prev in spout.init_calls[1:])
    assert committer.counts == Counter(data)


def test_late_results_and_late_commits_of_stale_attempts_are_ignored() -> None:
    """The first attempt of txid 2 hangs in its emit, the first commit of txid 3 in its
    write, each until the runner has timed it out and started the txid again: both
    finish late, and their late reports are ignored."""
    data = records(30)
    emitted = threading.Condition()

    def started_again(txid: int, spout: ListTransactionalSpout, since: int) -> None:
        """Wait until ``txid`` has been emitted more than ``since`` times."""
        with emitted:
            again = emitted.wait_for(
                lambda: sum(a.txid == txid for a, _ in spout.emits) > since, timeout=30
            )
        assert again, f"txid {txid} was never started again"

    class StuckOnce(ListTransactionalSpout):
        def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> list[Any]:
            first = not any(a.txid == 2 for a, _ in self.emits)
            rows = super().emit_batch(attempt, meta)
            with emitted:
                emitted.notify_all()
            if attempt.txid == 2 and first:
                started_again(2, self, 1)
            return rows

    class SlowFirstCommit(MemoryCommitter):
        def commit(self, attempt: TransactionAttempt, prepared: Counter[Any]) -> CommitOutcome:
            if attempt.txid == 3 and not any(a.txid == 3 for a, _ in self.calls):
                started_again(3, spout, sum(a.txid == 3 for a, _ in spout.emits))
            return super().commit(attempt, prepared)

    spout = StuckOnce(data, 10)
    committer = SlowFirstCommit()
    runner = make_runner(spout, committer, attempt_timeout_s=1.0, max_pending=2)
    stats = runner.run(until_drained=True)

    first_attempt_of_2 = next(a for a, _ in spout.emits if a.txid == 2)
    group = f"txid-2-attempt-{first_attempt_of_2.attempt_id}-run-"
    assert any(g.startswith(group) for g in runner.engine.cancelled)  # type: ignore[attr-defined]
    commits_of_3 = [o for a, o in committer.calls if a.txid == 3]
    assert commits_of_3 == [CommitOutcome.APPLIED, CommitOutcome.SKIPPED]
    assert stats.stale_ignored >= 2
    assert committer.counts == Counter(data)


def test_restart_replays_stored_txids_with_stored_metadata_before_new_ones() -> None:
    data = records(40)
    store = InMemoryStateStore()
    first = ListTransactionalSpout(data, 10)
    committer = MemoryCommitter()
    poison = FaultPlan([FaultRule(FaultPoint.AFTER_SINK_WRITE, 2, attempts=None)])
    with pytest.raises(PoisonBatchError):
        make_runner(first, committer, store, faults=poison, max_pending=2, max_attempts=1).run(
            until_drained=True
        )
    assert store.currtx == 2 and sorted(store.metas) == [1, 2, 3]
    stored = {t: Range.model_validate(store.metas[t]) for t in (2, 3)}

    data.extend(records(25))  # new data exists, and a different batch size would apply
    second = ListTransactionalSpout(data, 7)
    make_runner(second, committer, store, max_pending=2).run(until_drained=True)

    order = [a.txid for a, _ in second.emits]
    assert order[:2] == [2, 3] and min(order[2:]) == 4
    assert {a.txid: m for a, m in second.emits if a.txid in (2, 3)} == stored
    assert next(t for t, _ in second.init_calls) == 4
    assert 2 not in second.ready_calls and 3 not in second.ready_calls
    assert committer.counts == Counter(data)


def test_partitioned_replay_reads_the_stored_ranges_and_new_partitions_only_later() -> None:
    parts: list[list[Any]] = [records(6), ["p1-a"]]
    store = InMemoryStateStore()
    committer = MemoryCommitter()
    poison = FaultPlan([FaultRule(FaultPoint.PROCESS, 2, attempts=None)])
    first = ListPartitionedSpout(parts, 2)
    with pytest.raises(PoisonBatchError):
        make_runner(first, committer, store, faults=poison, max_pending=1, max_attempts=1).run(
            until_drained=True
        )
    ranges_2 = {p: m for a, p, m in first.emits if a.txid == 2}
    assert ranges_2 == {0: Range(start=2, count=2), 1: Range(start=1, count=0)}

    parts[0].extend(["late-0", "late-1"])
    parts.append(["p2-a", "p2-b", "p2-c"])  # a partition added after txid 2 started
    second = ListPartitionedSpout(parts, 2)
    make_runner(second, committer, store, max_pending=1).run(until_drained=True)

    assert {p: m for a, p, m in second.emits if a.txid == 2} == ranges_2  # no partition 2
    assert min(a.txid for a, p, _ in second.emits if p == 2) == 3
    assert Counter(r for part in parts for r in part) == committer.counts
    assert committer.committed_sequence() == [1, 2, 3, 4]  # 2 to 4 have an empty partition


def test_opaque_replay_may_differ_and_the_sink_is_still_exact() -> None:
    parts = [records(9), [f"q{i}" for i in range(7)]]

    def flaky(attempt: TransactionAttempt, partition: int, rows: list[Any]) -> list[Any]:
        if attempt.txid == 2 and attempt.attempt_id == first_attempt_of_2[0]:
            return [*rows[1:], "ghost", "ghost"]  # the first try lost one and invented two
        return rows

    first_attempt_of_2: list[int] = []
    spout = ListOpaqueSpout(parts, 3, source=flaky)
    original = spout.emit_partition_batch

    def remember(attempt: TransactionAttempt, p: int, last: Range | None) -> Any:
        if attempt.txid == 2 and not first_attempt_of_2:
            first_attempt_of_2.append(attempt.attempt_id)
        return original(attempt, p, last)

    spout.emit_partition_batch = remember  # type: ignore[method-assign]
    committer = MemoryCommitter(CommitMode.OPAQUE)
    faults = FaultPlan([FaultRule(FaultPoint.AFTER_SINK_WRITE, 2)])
    make_runner(spout, committer, faults=faults, max_pending=2).run(until_drained=True)

    outcomes_2 = [o for a, o in committer.calls if a.txid == 2]
    assert outcomes_2 == [CommitOutcome.APPLIED, CommitOutcome.REAPPLIED]
    assert "ghost" not in committer.counts
    assert committer.counts == Counter(r for part in parts for r in part)


def test_poison_batch_stops_with_txid_meta_and_cause_and_resumes_after_the_fix() -> None:
    data = records(30)
    store = InMemoryStateStore()
    committer = MemoryCommitter()
    poison = FaultPlan([FaultRule(FaultPoint.EMIT, 2, attempts=None)])
    with pytest.raises(PoisonBatchError) as info:
        make_runner(
            ListTransactionalSpout(data, 10), committer, store, faults=poison, max_attempts=3
        ).run(until_drained=True)
    assert info.value.txid == 2 and info.value.attempts == 3
    assert info.value.metadata == Range(start=10, count=10)
    assert isinstance(info.value.cause, InjectedFault) and "txid 2" in str(info.value)
    assert store.currtx == 2 and committer.counts == Counter(data[:10])

    make_runner(ListTransactionalSpout(data, 10), committer, store).run(until_drained=True)
    assert committer.counts == Counter(data)


def test_retries_back_off() -> None:
    data = records(20)
    spout = ListTransactionalSpout(data, 10)
    stamps: list[float] = []
    original = spout.emit_batch

    def stamped(attempt: TransactionAttempt, meta: Range) -> list[Any]:
        if attempt.txid == 1:
            stamps.append(time.monotonic())
        return original(attempt, meta)

    spout.emit_batch = stamped  # type: ignore[method-assign]
    faults = FaultPlan([FaultRule(FaultPoint.PROCESS, 1, attempts=frozenset({1, 2}))])
    committer = MemoryCommitter()
    make_runner(spout, committer, faults=faults, backoff_initial_s=0.1, backoff_max_s=1.0).run(
        until_drained=True
    )
    assert len(stamps) == 3
    assert stamps[1] - stamps[0] >= 0.1 and stamps[2] - stamps[1] >= 0.2
    assert committer.counts == Counter(data)


def test_step_timings_keep_only_the_latest_txids() -> None:
    """A topology runs for months: its per-txid timings must not grow with every txid."""
    from transactional.flow import HISTORY

    records = [f"r{i % 3}" for i in range(HISTORY + 6)]
    committer = MemoryCommitter()
    stats = make_runner(ListTransactionalSpout(records, batch_size=1), committer).run(
        until_drained=True
    )
    assert stats.committed_txids == len(records)
    assert [t.txid for t in stats.timings] == list(range(7, len(records) + 1))
    assert committer.counts == Counter(records)


def test_each_step_of_each_attempt_describes_its_spark_jobs() -> None:
    """What the Spark UI shows beside a job: the topology, the txid, the attempt number
    and the step, set before each step of each attempt (a retry says attempt=2)."""
    data = records(30)
    committer = MemoryCommitter()
    runner = make_runner(
        ListTransactionalSpout(data, 10),
        committer,
        faults=FaultPlan([FaultRule(FaultPoint.PROCESS, 2)]),
        max_pending=1,
    )
    engine = runner.engine
    runner.run(until_drained=True)
    steps = ("emit", "process", "prepare", "commit")

    def attempt(txid: int, number: int, upto: tuple[str, ...] = steps) -> list[str]:
        return [f"t txid={txid} attempt={number} step={s}" for s in upto]

    assert engine.descriptions == [
        *attempt(1, 1),
        *attempt(2, 1, ("emit", "process")),  # failed at the end of its process step
        *attempt(2, 2),
        *attempt(3, 1),
    ]
    assert committer.counts == Counter(data)


def test_only_the_processing_of_an_attempt_tells_the_engine_its_txid() -> None:
    """The engine puts the jobs of the oldest txid being processed first; a commit's
    jobs (no txid given) always go first, being what every later txid waits for."""
    committer = MemoryCommitter()
    runner = make_runner(ListTransactionalSpout(records(30), 10), committer, max_pending=1)
    engine = runner.engine
    runner.run(until_drained=True)
    begun = [
        (int(group.split("-")[1]), txid)
        for group, txid in engine.group_txids
        if group.startswith("txid-")
    ]
    assert begun == [(1, 1), (1, None), (2, 2), (2, None), (3, 3), (3, None)]
