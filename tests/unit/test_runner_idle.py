"""Idle sources cost nothing: a batch that turns out empty is not committed (no metadata
left in the store, no sink write), polls back off while the source stays idle, and new
data then flows and is counted exactly."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from tests.runner_logs import Said
from transactional.config import RunnerConfig
from transactional.runner import TransactionalRunner
from transactional.testing import (
    InMemoryEngine,
    InMemoryStateStore,
    ListPartitionedSpout,
    ListTransactionalSpout,
    MemoryCommitter,
    Range,
    counting_topology,
)
from transactional.types import TransactionAttempt


class AlwaysReady(ListTransactionalSpout):
    """A user's spout that never overrides ``is_ready``: every poll decides a batch,
    empty when nothing is new. Records when each decision was asked for."""

    def __init__(self, records: list[Any], batch_size: int) -> None:
        super().__init__(records, batch_size)
        self.decided_at: list[float] = []

    def is_ready(self, txid: int, prev_meta: Range | None) -> bool:
        return True

    def initialize_transaction(self, txid: int, prev_meta: Range | None) -> Range:
        self.decided_at.append(time.monotonic())
        return super().initialize_transaction(txid, prev_meta)


class AlwaysReadyPartitions(ListPartitionedSpout):
    def __init__(self, partitions: list[list[Any]], batch_size: int) -> None:
        super().__init__(partitions, batch_size)
        self.polls = 0

    def is_ready(self, txid: int, last_metas: Any) -> bool:
        self.polls += 1
        return True


def runner_for(spout: Any, sink: MemoryCommitter, store: InMemoryStateStore, **config: Any):  # type: ignore[no-untyped-def]
    settings: dict[str, Any] = {
        "topology_id": "t",
        "max_pending": 2,
        "backoff_initial_s": 0.0,
        "backoff_max_s": 0.0,
        "poll_interval_s": 0.001,
        "poll_max_s": 0.004,
    }
    settings.update(config)
    return TransactionalRunner(
        counting_topology(spout, sink),
        store,
        config=RunnerConfig(**settings),
        engine=InMemoryEngine(),
    )


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def in_thread(runner: TransactionalRunner) -> threading.Thread:
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    return thread


def test_idle_polls_commit_nothing_and_new_data_then_flows_exactly() -> None:
    data = [f"w{i % 3}" for i in range(10)]
    spout = AlwaysReady(data, batch_size=4)
    store, sink = InMemoryStateStore(), MemoryCommitter()
    runner = runner_for(spout, sink, store)
    thread = in_thread(runner)
    wait_for(lambda: sink.last_txid == 3)  # 4 + 4 + 2 records
    wait_for(lambda: runner.stats.empty_polls >= 1)
    settled = len(spout.decided_at)  # a second txid in flight may be retracted just after
    wait_for(lambda: len(spout.decided_at) >= settled + 5)
    polls = len(spout.decided_at)
    emits, retracts = len(spout.emits), list(store.retracted)
    wait_for(lambda: len(spout.decided_at) >= polls + 200)

    # 200 idle polls later: no txid committed or left in the store, no sink call.
    assert store.currtx == 4 and store.advances == [1, 2, 3]
    assert sorted(store.metas) == [3] and store.digests == {}
    assert sink.committed_sequence() == [1, 2, 3]
    assert sink.counts == Counter(data)
    # The empty batch was emitted (once per txid in flight: at most max_pending) and
    # retracted; the same decision again is known empty, so no poll since stored or
    # emitted anything.
    assert len(spout.emits) == emits and store.retracted == retracts
    empty = [meta for _, meta in spout.emits if meta.count == 0]
    assert 1 <= len(empty) <= 2 and 1 <= runner.stats.empty_polls <= 2

    more = [f"n{i % 4}" for i in range(9)]
    data.extend(more)
    wait_for(lambda: store.currtx == 7)  # 4 + 4 + 1 new records
    runner.stop()
    thread.join(30)
    assert sink.counts == Counter(data)
    assert sink.committed_sequence() == [1, 2, 3, 4, 5, 6]


def test_idle_polls_back_off_to_the_maximum_interval() -> None:
    spout = AlwaysReady([], batch_size=4)
    runner = runner_for(spout, MemoryCommitter(), InMemoryStateStore(), poll_max_s=0.03)
    thread = in_thread(runner)
    wait_for(lambda: len(spout.decided_at) >= 20)
    runner.stop()
    thread.join(30)
    gaps = [b - a for a, b in zip(spout.decided_at, spout.decided_at[1:], strict=False)]
    # Intervals double from 1 ms: by the 7th idle poll every wait is the 30 ms maximum.
    # (A lower bound only: the runner never asks before the interval has passed.)
    assert all(gap >= 0.03 * 0.95 for gap in gaps[6:])


def test_a_partitioned_txid_commits_when_any_partition_has_records_and_not_when_none() -> None:
    parts: list[list[Any]] = [["a", "b"], [], ["c"]]
    spout = AlwaysReadyPartitions(parts, batch_size=5)
    store, sink = InMemoryStateStore(), MemoryCommitter()
    runner = runner_for(spout, sink, store)
    thread = in_thread(runner)
    wait_for(lambda: sink.last_txid == 1)
    polls = spout.polls
    wait_for(lambda: spout.polls >= polls + 50)
    assert store.currtx == 2 and sorted(store.metas) == [1]
    parts[1].extend(["b", "d"])  # only the partition that was empty gets data
    wait_for(lambda: store.currtx == 3)
    runner.stop()
    thread.join(30)
    assert sink.counts == Counter(["a", "b", "c", "b", "d"])
    assert store.partitions[2] == {
        0: Range(start=2, count=0).model_dump(),
        1: Range(start=0, count=2).model_dump(),
        2: Range(start=1, count=0).model_dump(),
    }


def test_a_stored_empty_txid_found_on_restart_is_retracted_not_committed() -> None:
    store, sink = InMemoryStateStore(), MemoryCommitter()
    store.metas[1] = Range(start=0, count=0).model_dump()  # a txid an earlier run started
    data: list[str] = []
    spout = AlwaysReady(data, batch_size=3)
    runner = runner_for(spout, sink, store)
    stats = runner.run(until_drained=True)
    assert stats.committed_txids == 0 and store.currtx == 1 and store.metas == {}
    assert sink.calls == [] and store.retracted == [1]
    data.extend(["x", "y", "x"])
    runner_for(AlwaysReady(data, batch_size=3), sink, store).run(until_drained=True)
    assert sink.counts == Counter(data) and store.currtx == 2


def test_until_drained_ends_on_an_empty_batch_of_a_spout_that_is_always_ready() -> None:
    data = [f"k{i % 4}" for i in range(7)]
    spout = AlwaysReady(data, batch_size=3)
    store, sink = InMemoryStateStore(), MemoryCommitter()
    done = threading.Event()

    def run() -> None:
        runner_for(spout, sink, store).run(until_drained=True)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(60), "a spout that is always ready never drained"
    assert sink.counts == Counter(data) and store.currtx == 4


def test_an_empty_emit_of_one_attempt_is_not_taken_for_the_whole_txid() -> None:
    """The first emit of txid 2 is empty (the source was slow): nothing is committed
    for it, and the next poll's batch, holding the records, is."""
    data = ["a", "b"]
    seen: list[int] = []

    class LateRecords(AlwaysReady):
        def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> list[Any]:  # type: ignore[override]
            seen.append(attempt.txid)
            return super().emit_batch(attempt, meta)

    spout = LateRecords(data, batch_size=2)
    store, sink = InMemoryStateStore(), MemoryCommitter()
    runner = runner_for(spout, sink, store, max_pending=1)
    thread = in_thread(runner)
    wait_for(lambda: store.retracted == [2])
    data.extend(["c", "a"])
    wait_for(lambda: store.currtx == 3)
    runner.stop()
    thread.join(30)
    assert sink.counts == Counter(data)
    assert [meta for _, meta in spout.emits if _.txid == 2][-1] == Range(start=2, count=2)


def test_a_spout_that_needs_its_empty_batches_gets_them_committed() -> None:
    class Compacted(ListTransactionalSpout):
        """Fixed-size ranges of a log whose second range was compacted away."""

        commit_empty_batches = True

        def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> list[Any]:  # type: ignore[override]
            return [] if meta.start == 3 else super().emit_batch(attempt, meta)

    data = [f"c{i}" for i in range(9)]
    store, sink = InMemoryStateStore(), MemoryCommitter()
    runner_for(Compacted(data, batch_size=3), sink, store).run(until_drained=True)
    assert store.currtx == 4 and store.retracted == []
    assert sink.committed_sequence() == [1, 2, 3]
    assert sink.counts == Counter(data[:3] + data[6:])


def test_a_stop_lets_a_running_commit_finish_and_advances_past_it() -> None:
    """Ctrl-C while txid 2 is being written: the write completes, and the store moves
    past it, so the next run neither replays it nor finds a sink ahead of the store."""
    entered, release = threading.Event(), threading.Event()

    class SlowSink(MemoryCommitter):
        def commit(self, attempt: TransactionAttempt, prepared: Any) -> Any:
            if attempt.txid == 2:
                entered.set()
                release.wait(30)
            return super().commit(attempt, prepared)

    data = [f"s{i % 3}" for i in range(12)]
    store, sink = InMemoryStateStore(), SlowSink()
    runner = runner_for(ListTransactionalSpout(data, 4), sink, store, max_pending=1)
    # The runner says it waits for the commit in flight: stopped while it still runs.
    with Said("transactional.runner", "waiting for the commit of txid(s) 2") as said:
        thread = in_thread(runner)
        assert entered.wait(30)
        runner.stop()
        assert said.seen.wait(30)
    release.set()
    thread.join(30)
    assert not thread.is_alive()
    assert sink.last_txid == 2 and store.currtx == 3 and runner.stats.last_committed == 2
    assert sink.counts == Counter(data[:8])
