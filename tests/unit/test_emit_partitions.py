"""A partitioned spout's optional ``emit_partitions``: one frame of every partition of a
txid, each row tagged with its partition. The counts are exact, the determinism check
is the same as per partition (a txid first emitted one way and replayed the other
passes it; a changed partition is still named), and a frame tagged wrongly is a
contract error that stops the run."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from transactional import contracts
from transactional.errors import BatchConfigurationError, ContractError, NondeterministicSpoutError
from transactional.faults import FaultPoint
from transactional.spout import PARTITION_COLUMN
from transactional.testing import (
    FaultPlan,
    InMemoryEngine,
    InMemoryStateStore,
    ListPartitionedSpout,
    MemoryCommitter,
    Range,
    TopologyHarness,
    counting_topology,
)
from transactional.types import TransactionAttempt

PARTS = [[f"a{i % 3}" for i in range(7)], [f"b{i % 2}" for i in range(5)], []]


class Combined(ListPartitionedSpout):
    """Emits every partition at once as ``(partition, row)`` pairs while ``combined``;
    ``shift`` tags rows with a partition off by that much; ``extra`` adds a row to
    partition 1 (a source that changed)."""

    combined = True
    shift = 0
    extra = False

    def __init__(self, partitions: list[list[Any]], batch_size: int) -> None:
        super().__init__(partitions, batch_size)
        self.combined_emits: list[int] = []

    def emit_partition_batch(  # type: ignore[override]
        self, attempt: TransactionAttempt, partition: int, meta: Range
    ) -> list[Any]:
        rows = super().emit_partition_batch(attempt, partition, meta)
        return [*rows, "extra"] if type(self).extra and partition == 1 else rows

    def emit_partitions(self, attempt: TransactionAttempt, metas: Mapping[int, Range]) -> Any:
        if not type(self).combined:
            return None
        self.combined_emits.append(attempt.txid)
        return [
            (p + type(self).shift, row)
            for p, meta in metas.items()
            for row in self.emit_partition_batch(attempt, p, meta)
        ]


@pytest.fixture(autouse=True)
def _reset() -> None:
    Combined.combined, Combined.shift, Combined.extra = True, 0, False


def harness(sink: MemoryCommitter, store: InMemoryStateStore) -> TopologyHarness:
    return TopologyHarness(
        lambda: counting_topology(Combined(PARTS, 2), sink), store=store, engine=InMemoryEngine()
    )


def test_one_frame_of_all_partitions_counts_every_record_once() -> None:
    sink, store = MemoryCommitter(), InMemoryStateStore()
    harness(sink, store).run_until_drained()
    assert sink.counts == Counter(row for part in PARTS for row in part)
    assert sink.last_txid == 4  # ceil(7 / 2) txids of the longest partition
    # Every txid stored a digest per partition, the empty partition's included.
    assert all(set(d) == {"0", "1", "2"} for d in store.digests.values())


def test_a_replay_may_take_the_other_way_and_still_pass_the_check() -> None:
    sink, store = MemoryCommitter(), InMemoryStateStore()
    h = harness(sink, store)
    assert h.run_until_drained(FaultPlan().crash(FaultPoint.BEFORE_SINK_WRITE, txid=2)).crashed
    Combined.combined = False  # txid 2 first emitted as one frame, replayed per partition
    h.run_until_drained()
    assert sink.counts == Counter(row for part in PARTS for row in part)


def test_a_changed_partition_is_still_named() -> None:
    sink, store = MemoryCommitter(), InMemoryStateStore()
    h = harness(sink, store)
    assert h.run_until_drained(FaultPlan().crash(FaultPoint.BEFORE_SINK_WRITE, txid=2)).crashed
    Combined.extra = True
    with pytest.raises(BatchConfigurationError) as info:
        h.run_until_drained()
    assert isinstance(info.value.cause, NondeterministicSpoutError)
    message = str(info.value.cause)
    assert "partition 1: first emit 2 records" in message and "this replay 3 records" in message
    assert "partition 0" not in message


def test_rows_tagged_with_a_partition_the_txid_does_not_have_stop_the_run() -> None:
    Combined.shift = 3
    sink, store = MemoryCommitter(), InMemoryStateStore()
    with pytest.raises(BatchConfigurationError) as info:
        harness(sink, store).run_until_drained()
    assert isinstance(info.value.cause, ContractError)
    assert sink.calls == []


class SparkLike:
    columns = ["raw", "error"]


def test_a_spark_frame_without_the_partition_column_is_a_contract_error() -> None:
    with pytest.raises(ContractError, match=f"without the column '{PARTITION_COLUMN}'"):
        contracts.check_tagged_frame(SparkLike(), lambda _: True, "spout 's'", "emit_partitions", 3)
    tagged = SparkLike()
    tagged.columns = ["raw", PARTITION_COLUMN]
    assert contracts.check_tagged_frame(tagged, lambda _: True, "s", "emit_partitions", 3) is tagged
