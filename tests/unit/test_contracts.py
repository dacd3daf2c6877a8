"""Broken contracts are refused on their first occurrence, never retried, with a message
naming the component (its name in the topology and its class), what it returned and
what it must return. The toolkit reports fault rules that never fired, and counts a
txid's attempts across drops."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from transactional.bolt import Bolt
from transactional.config import RunnerConfig
from transactional.errors import BatchConfigurationError, ContractError, TopologyValidationError
from transactional.faults import FaultPoint
from transactional.runner import TransactionalRunner
from transactional.testing import (
    CountingBolt,
    FaultPlan,
    FaultPlanError,
    InMemoryEngine,
    InMemoryStateStore,
    ListOpaqueSpout,
    ListPartitionedSpout,
    ListTransactionalSpout,
    MemoryCommitter,
    Range,
    TopologyHarness,
    UnmetFaultWarning,
    counting_topology,
)
from transactional.topology import TopologyBuilder
from transactional.types import CommitMode, TransactionAttempt

DATA = [f"r{i % 4}" for i in range(12)]
MODULE = "tests.unit.test_contracts"
FRAME = "a pyspark.sql.DataFrame of the runner's session"


def run_to_refusal(topology: Any, store: InMemoryStateStore | None = None) -> str:
    """Run until the runner stops; the refusal must come on the first attempt."""
    runner = TransactionalRunner(
        topology,
        store or InMemoryStateStore(),
        config=RunnerConfig(
            topology_id="t", max_pending=1, max_attempts=5, backoff_initial_s=0, backoff_max_s=0
        ),
        engine=InMemoryEngine(),
    )
    with pytest.raises(BatchConfigurationError) as info:
        runner.run(until_drained=True)
    assert isinstance(info.value.cause, ContractError)
    assert runner.stats.failures == 1  # not retried
    return str(info.value.cause)


class NoneBolt(Bolt):
    def process(self, attempt: TransactionAttempt, batch: Any) -> Any:
        return None  # forgot the return


class NotAStream(Bolt):
    outputs = ("counts", "bad")

    def process(self, attempt: TransactionAttempt, batch: Any) -> Any:
        return {"counts": CountingBolt().process(attempt, batch), "bad": {"not": "a frame"}}


class BadFinish(CountingBolt):
    def finish_batch(self, attempt: TransactionAttempt, outputs: Mapping[str, Any]) -> Any:
        return None


def bolt_topology(bolt: Bolt, stream: str = "count") -> Any:
    spout = ListTransactionalSpout(DATA, 4)
    return (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("count", bolt)
        .set_committer("sink", MemoryCommitter(), stream)
        .build()
    )


def test_a_bolt_returning_none_is_refused_naming_it() -> None:
    message = run_to_refusal(bolt_topology(NoneBolt()))
    assert message == (
        f"bolt 'count' ({MODULE}.NoneBolt).process returned None (txid 1); it must return "
        "a DataFrame (only when it declares one stream) or a mapping with exactly its "
        "declared streams ['default'], each a pyspark.sql.DataFrame of the runner's "
        "session"
    )


def test_a_stream_that_is_not_a_frame_is_refused_naming_the_stream() -> None:
    message = run_to_refusal(bolt_topology(NotAStream(), "count:counts"))
    assert message.startswith(
        f"bolt 'count' ({MODULE}.NotAStream).process returned dict, not a "
        "pyspark.sql.DataFrame of the runner's session as stream 'bad' (txid 1)"
    )


def test_finish_batch_is_checked_too() -> None:
    message = run_to_refusal(bolt_topology(BadFinish()))
    assert message.startswith(f"bolt 'count' ({MODULE}.BadFinish).finish_batch returned None")


class BarePartition(ListOpaqueSpout):
    def emit_partition_batch(self, attempt: Any, partition: int, last_meta: Any) -> Any:  # type: ignore[override]
        return super().emit_partition_batch(attempt, partition, last_meta)[1]  # no metadata


class MetaOnly(ListOpaqueSpout):
    def emit_partition_batch(self, attempt: Any, partition: int, last_meta: Any) -> Any:  # type: ignore[override]
        meta, rows = super().emit_partition_batch(attempt, partition, last_meta)
        return rows, meta  # swapped


def test_an_opaque_spout_returning_a_bare_batch_is_refused() -> None:
    topology = counting_topology(BarePartition([DATA], 4), MemoryCommitter(CommitMode.OPAQUE))
    message = run_to_refusal(topology)
    assert message == (
        f"spout 'spout' ({MODULE}.BarePartition).emit_partition_batch returned list for "
        "txid 1 partition 0; it must return a pair (metadata, DataFrame): (Range(...), the "
        "partition's batch)"
    )
    topology = counting_topology(MetaOnly([DATA], 4), MemoryCommitter(CommitMode.OPAQUE))
    assert run_to_refusal(topology).startswith(
        f"spout 'spout' ({MODULE}.MetaOnly).emit_partition_batch returned (list, ...) for "
        "txid 1 partition 0; it must return a pair"
    )


class ReadyNone(ListTransactionalSpout):
    def is_ready(self, txid: int, prev_meta: Range | None) -> Any:
        if prev_meta is None or prev_meta.end < len(self.records):
            return True
        # forgot the return: an idle spout would look idle forever, silently


class PartitionsAsText(ListPartitionedSpout):
    def num_partitions(self) -> Any:
        return "1"


def test_is_ready_and_num_partitions_must_return_their_types() -> None:
    with pytest.raises(BatchConfigurationError) as info:
        TransactionalRunner(
            counting_topology(ReadyNone(DATA, 6), MemoryCommitter()),
            InMemoryStateStore(),
            config=RunnerConfig(topology_id="t", max_pending=1),
            engine=InMemoryEngine(),
        ).run(until_drained=True)
    assert str(info.value.cause) == (
        f"spout 'spout' ({MODULE}.ReadyNone).is_ready returned None (None) for txid 3; it "
        "must return True or False"
    )
    with pytest.raises(BatchConfigurationError) as info:
        TransactionalRunner(
            counting_topology(PartitionsAsText([DATA], 6), MemoryCommitter()),
            InMemoryStateStore(),
            config=RunnerConfig(topology_id="t"),
            engine=InMemoryEngine(),
        ).run(until_drained=True)
    assert str(info.value.cause) == (
        f"spout 'spout' ({MODULE}.PartitionsAsText).num_partitions returned '1' (str); it "
        "must return a non-negative int"
    )


class NoOutcome(MemoryCommitter):
    def commit(self, attempt: TransactionAttempt, prepared: Counter[Any]) -> Any:
        super().commit(attempt, prepared)
        return None


def test_a_committer_must_return_a_commit_outcome() -> None:
    sink = NoOutcome()
    message = run_to_refusal(counting_topology(ListTransactionalSpout(DATA, 4), sink))
    assert message.startswith(
        f"committer 'sink' ({MODULE}.NoOutcome).commit returned None (None) for txid 1; it "
        "must return a CommitOutcome"
    )
    assert sink.last_txid == 1  # it wrote: the restart's commit of txid 1 skips it


class Collecting(MemoryCommitter):
    """Asks for its input on the driver (``collect_plan``) and sums what it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[tuple[int, dict[str, Any]]] = []

    def collect_plan(self, attempt: TransactionAttempt, inputs: Mapping[str, Any]) -> Any:
        (rows,) = inputs.values()
        return {"rows": rows}

    def prepare(self, attempt: TransactionAttempt, inputs: Mapping[str, Any]) -> Any:
        raise AssertionError("prepare is not called when collect_plan asked for frames")

    def prepare_collected(
        self, attempt: TransactionAttempt, inputs: Mapping[str, Any], collected: Mapping[str, Any]
    ) -> Any:
        self.handed.append((attempt.txid, dict(collected)))
        return super().prepare(attempt, {"rows": collected["rows"]})


class BadPlan(MemoryCommitter):
    def collect_plan(self, attempt: TransactionAttempt, inputs: Mapping[str, Any]) -> Any:
        return {"rows": "not a frame"}


def test_collected_frames_reach_their_committer_and_plain_ones_prepare() -> None:
    collecting, plain = Collecting(), MemoryCommitter()
    topology = counting_topology(ListTransactionalSpout(DATA, 4), collecting, plain)
    runner = TransactionalRunner(
        topology,
        InMemoryStateStore(),
        config=RunnerConfig(topology_id="t", max_pending=1),
        engine=InMemoryEngine(),
    )
    runner.run(until_drained=True)
    want = dict(Counter(DATA))
    assert collecting.counts == want and plain.counts == want
    assert [txid for txid, _ in collecting.handed] == [1, 2, 3]
    assert [sorted(rows) for _, rows in collecting.handed] == [["rows"]] * 3
    batches = [DATA[0:4], DATA[4:8], DATA[8:12]]
    for (txid, rows), records in zip(collecting.handed, batches, strict=True):
        assert sorted(rows["rows"]) == sorted(Counter(records).items()), txid
    assert [a.txid for a in plain.prepared] == [1, 2, 3]


def test_a_collect_plan_that_is_not_frames_is_refused_naming_it() -> None:
    message = run_to_refusal(counting_topology(ListTransactionalSpout(DATA, 4), BadPlan()))
    assert message == (
        f"committer 'sink' ({MODULE}.BadPlan).collect_plan returned str, not {FRAME} under "
        f"'rows' (txid 1); it must return a mapping of names to frames, each {FRAME} (empty: "
        "collect nothing)"
    )


class Named(MemoryCommitter):
    def input_names(self) -> frozenset[str]:
        return frozenset({"words", "dead"})


def test_committer_input_names_are_checked_at_build() -> None:
    builder = (
        TopologyBuilder()
        .set_spout(ListTransactionalSpout(DATA, 4))
        .set_bolt("count", CountingBolt())
        .set_committer("sink", Named(), {"words": "count"})
    )
    with pytest.raises(TopologyValidationError) as info:
        builder.build()
    assert str(info.value) == (
        f"committer 'sink' ({MODULE}.Named) reads inputs ['dead', 'words'] but is wired with "
        "['words']: pass set_committer('sink', ..., inputs={name: stream}) with exactly "
        "those names"
    )


# ---------------------------------------------------------------------- the toolkit


def test_a_rule_that_never_fires_is_reported_and_fails_a_strict_harness() -> None:
    def build() -> Any:
        return counting_topology(ListTransactionalSpout(DATA, 4), MemoryCommitter())

    plan = (
        FaultPlan()
        .fail(FaultPoint.EMIT, txid=2)
        .fail(FaultPoint.EMIT, txid=9)  # there are only 3 txids
        .fail(FaultPoint.PROCESS, txid=1, attempts=[1, 4])  # attempt 4 never happens
    )
    loose = TopologyHarness(build, store=InMemoryStateStore(), engine=InMemoryEngine())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loose.run_until_drained(plan)
    reported = [str(w.message) for w in caught if w.category is UnmetFaultWarning]
    assert len(reported) == 1
    assert "emit:9:1: attempt 1 of txid 9 never reached emit" in reported[0]
    assert "process:1:1+4: attempt 4 of txid 1 never reached process" in reported[0]
    assert "emit:2" not in reported[0]

    strict = TopologyHarness(
        build, store=InMemoryStateStore(), engine=InMemoryEngine(), strict=True
    )
    with pytest.raises(FaultPlanError, match="emit:9:1: attempt 1 of txid 9 never reached emit"):
        strict.run_until_drained(FaultPlan().fail(FaultPoint.EMIT, txid=9))
    # A plan whose every rule fired passes quietly.
    strict = TopologyHarness(
        build, store=InMemoryStateStore(), engine=InMemoryEngine(), strict=True
    )
    strict.run_until_drained(FaultPlan().fail(FaultPoint.EMIT, txid=3))


def test_a_txid_dropped_because_a_lower_one_failed_counts_an_attempt() -> None:
    """With two in flight, txid 1 fails at emit; txid 2, started beside it, is dropped
    and started again: that second start is its attempt 2 (it was attempt 1 again, so a
    rule for attempt 1 of txid 2 fired on both starts)."""
    seen: list[tuple[int, int]] = []

    class Recording(FaultPlan):
        def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
            if point is FaultPoint.AFTER_STORE_META:
                seen.append((attempt.txid, number))
            super().check(point, attempt, number)

    plan = Recording(FaultPlan().fail(FaultPoint.EMIT, txid=1).rules)
    sink = MemoryCommitter()
    harness = TopologyHarness(
        lambda: counting_topology(ListTransactionalSpout(DATA, 4), sink),
        store=InMemoryStateStore(),
        engine=InMemoryEngine(),
        strict=True,
    )
    harness.run_until_drained(plan, max_pending=2)
    assert sorted(n for t, n in seen if t == 1) == [1, 2]
    assert sorted(n for t, n in seen if t == 2) == [1, 2]
    assert sorted(n for t, n in seen if t == 3) == [1]
    assert sink.counts == Counter(DATA) and sink.committed_sequence() == [1, 2, 3]


def _frame_of(module: str) -> object:
    """An object whose class says it is PySpark's DataFrame of ``module``."""
    return type("DataFrame", (), {"__module__": module})()


@pytest.mark.parametrize(
    ("module", "session", "other"),
    [
        ("pyspark.sql.connect.dataframe", "a Spark Connect DataFrame", "classic session"),
        ("pyspark.sql.classic.dataframe", "a classic DataFrame", "Spark Connect session"),
    ],
)
def test_a_frame_of_the_other_kind_of_session_is_refused_saying_which(
    module: str, session: str, other: str
) -> None:
    from transactional.contracts import frame_problem

    problem = frame_problem(_frame_of(module), lambda value: False)
    assert problem == (
        f"{session} ({module}.DataFrame) on a {other}; the runner needs a "
        "pyspark.sql.DataFrame of the runner's session: build it with the SparkSession "
        "the runner gives at open"
    )
    assert frame_problem(_frame_of(module), lambda value: True) is None
