"""The determinism check: the first emit of a txid stores a record count and a content
checksum per partition; a replay that differs stops the topology before any sink sees
it, naming the spout, the txid, the partition and both counts."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from transactional.config import RunnerConfig
from transactional.errors import BatchConfigurationError, NondeterministicSpoutError
from transactional.faults import FaultPoint
from transactional.runner import TransactionalRunner
from transactional.testing import (
    FaultPlan,
    InMemoryEngine,
    InMemoryStateStore,
    ListOpaqueSpout,
    ListPartitionedSpout,
    ListTransactionalSpout,
    MemoryCommitter,
    Range,
    TopologyHarness,
    counting_topology,
)
from transactional.types import CommitMode, TransactionAttempt


class Drifting(ListTransactionalSpout):
    """Returns other records for the same metadata once ``drift`` is set: a source read
    by position whose data was rewritten under it."""

    drift = False

    def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> list[Any]:  # type: ignore[override]
        rows = super().emit_batch(attempt, meta)
        return [f"{r}-changed" for r in rows][:-1] if type(self).drift else rows


class DriftingPartitions(ListPartitionedSpout):
    drift = False

    def emit_partition_batch(  # type: ignore[override]
        self, attempt: TransactionAttempt, partition: int, meta: Range
    ) -> list[Any]:
        rows = super().emit_partition_batch(attempt, partition, meta)
        if type(self).drift and partition == 1:
            return [*rows, "extra"]
        return rows


DATA = [f"r{i % 5}" for i in range(20)]


def harness(build: Any, store: InMemoryStateStore, **config: Any) -> TopologyHarness:
    return TopologyHarness(build, store=store, engine=InMemoryEngine(), **config)


def test_a_replay_that_differs_stops_before_any_sink_sees_it() -> None:
    Drifting.drift = False
    store = InMemoryStateStore()
    first, second = MemoryCommitter(), MemoryCommitter()

    def build() -> Any:
        return counting_topology(Drifting(DATA, 5), first, second)

    h = harness(build, store)
    # txid 2 is written to the first sink only; the process dies before the second.
    crashed = h.run_until_drained(FaultPlan().crash(FaultPoint.BETWEEN_COMMITTERS, txid=2))
    assert crashed.crashed
    assert first.last_txid == 2 and second.last_txid == 1
    assert store.digests[2] == {"0": [5, store.digests[2]["0"][1]]}

    Drifting.drift = True  # the source changed under the stored metadata
    with pytest.raises(BatchConfigurationError) as info:
        h.run_until_drained()
    cause = info.value.cause
    assert isinstance(cause, NondeterministicSpoutError)
    message = str(cause)
    assert message.startswith(
        "spout 'spout' (tests.unit.test_runner_determinism.Drifting) is not deterministic: "
        "the replay of txid 2 (metadata Range(start=5, count=5)) differs from its first emit; "
        "first emit 5 records (checksum "
    )
    assert "this replay 4 records (checksum " in message
    assert "check_determinism=False" in message
    # Neither sink saw the replay: the second still holds txid 1, nothing mixed.
    assert second.last_txid == 1 and second.counts == Counter(DATA[:5])
    assert first.counts == Counter(DATA[:10])
    assert store.currtx == 2


def test_a_partitioned_replay_names_the_partition_that_changed() -> None:
    DriftingPartitions.drift = False
    store, sink = InMemoryStateStore(), MemoryCommitter()
    parts = [DATA[:6], DATA[6:12], DATA[12:]]

    def build() -> Any:
        return counting_topology(DriftingPartitions(parts, 3), sink)

    h = harness(build, store)
    plan = FaultPlan().fail(FaultPoint.BEFORE_SINK_WRITE, txid=1)
    DriftingPartitions.drift = False

    class Flip(FaultPlan):
        def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
            try:
                super().check(point, attempt, number)
            except Exception:
                DriftingPartitions.drift = True  # the replay after this failure differs
                raise

    flip = Flip(plan.rules)
    with pytest.raises(BatchConfigurationError) as info:
        h.run_until_drained(flip, max_pending=1)
    message = str(info.value.cause)
    assert "the replay of txid 1" in message
    assert "partition 1: first emit 3 records" in message and "this replay 4 records" in message
    assert "partition 0" not in message and "partition 2" not in message
    assert sink.calls == []  # the failure came before the sink write; the replay never did


def test_the_check_can_be_switched_off() -> None:
    Drifting.drift = False
    store = InMemoryStateStore()
    sink = MemoryCommitter()

    def build() -> Any:
        return counting_topology(Drifting(DATA, 5), sink)

    h = harness(build, store, check_determinism=False)
    assert h.run_until_drained(FaultPlan().crash(FaultPoint.BEFORE_SINK_WRITE, txid=2)).crashed
    Drifting.drift = True
    h.run_until_drained()
    assert store.digests == {} and store.currtx == 5
    changed = Counter(f"{r}-changed" for r in DATA[5:10][:-1])
    assert sink.counts == Counter(DATA[:5]) + changed + Counter(
        f"{r}-changed" for r in DATA[10:15][:-1]
    ) + Counter(f"{r}-changed" for r in DATA[15:][:-1])


def test_opaque_spouts_are_exempt_and_store_no_digest() -> None:
    calls = Counter[int]()

    def shifting(attempt: TransactionAttempt, partition: int, rows: list[Any]) -> list[Any]:
        calls[attempt.txid] += 1
        lost = attempt.txid == 2 and calls[2] == 1  # txid 2's first emit lost a record
        return rows[:-1] if lost else rows

    store = InMemoryStateStore()
    sink = MemoryCommitter(CommitMode.OPAQUE)

    def build() -> Any:
        return counting_topology(ListOpaqueSpout([DATA], 5, shifting), sink)

    h = harness(build, store)
    h.run_until_drained(FaultPlan().fail(FaultPoint.AFTER_SINK_WRITE, txid=2))
    assert calls[2] == 2  # replayed, with another batch: no determinism error
    assert store.digests == {} and sink.counts == Counter(DATA)


def test_digests_are_kept_only_for_uncommitted_txids() -> None:
    store, sink = InMemoryStateStore(), MemoryCommitter()
    runner = TransactionalRunner(
        counting_topology(ListTransactionalSpout(DATA, 4), sink),
        store,
        config=RunnerConfig(topology_id="t", max_pending=3),
        engine=InMemoryEngine(),
    )
    runner.run(until_drained=True)
    assert store.currtx == 6 and store.digests == {} and sink.counts == Counter(DATA)
