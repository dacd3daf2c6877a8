"""transactional.testing as a user meets it: fault plans in code and as strings, and the
harness that crashes a run and resumes it, on in-memory doubles (and SQLite).

Every run that ends is followed by a rerun to completion and an exact check of the
sink against ``Counter(records)``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinators import SQLiteStateStore
from transactional.errors import ConfigurationError, InjectedFault, PoisonBatchError
from transactional.testing import (
    FaultPlan,
    FaultPlanError,
    FaultPoint,
    FaultRule,
    InMemoryEngine,
    InMemoryStateStore,
    ListTransactionalSpout,
    MemoryCommitter,
    Range,
    SimulatedCrash,
    TopologyHarness,
    counting_topology,
)
from transactional.testing import plugin as testing_plugin
from transactional.topology import Topology
from transactional.types import CommitOutcome, TransactionAttempt


def records(n: int) -> list[str]:
    return [f"r{i % 7}" for i in range(n)]


class Job:
    """One topology over ``data``, its sinks held here so they outlive every run, and
    the spout of every run kept for inspection."""

    def __init__(
        self,
        data: list[Any],
        batch_size: int = 10,
        sinks: int = 1,
        spout: Callable[[list[Any], int], ListTransactionalSpout] = ListTransactionalSpout,
    ) -> None:
        self.data = data
        self.batch_size = batch_size
        self.make_spout = spout
        self.sinks = [MemoryCommitter() for _ in range(sinks)]
        self.spouts: list[ListTransactionalSpout] = []

    def build(self) -> Topology:
        spout = self.make_spout(self.data, self.batch_size)
        self.spouts.append(spout)
        return counting_topology(spout, *self.sinks)

    def harness(self, store: Any = None, **options: Any) -> TopologyHarness:
        return TopologyHarness(
            self.build, store=store or InMemoryStateStore(), engine=InMemoryEngine(), **options
        )

    def assert_exact(self) -> None:
        for sink in self.sinks:
            assert sink.counts == Counter(self.data)


# ---------------------------------------------------------------------- plans in code


def test_fail_on_given_attempts_retries_with_the_same_metadata() -> None:
    job = Job(records(30))
    plan = FaultPlan().fail(FaultPoint.PROCESS, txid=2, attempts=[1, 2])
    result = job.harness().run_until_drained(plan, max_pending=1)

    assert not result.crashed and result.stats.failures == 2
    assert result.injected == [(FaultPoint.PROCESS, 2, 1), (FaultPoint.PROCESS, 2, 2)]
    metas_of_2 = [m for a, m in job.spouts[0].emits if a.txid == 2]
    assert metas_of_2 == [Range(start=10, count=10)] * 3
    assert job.sinks[0].committed_sequence() == [1, 2, 3]
    job.assert_exact()


def test_fail_on_every_attempt_stops_the_run_and_a_clean_rerun_finishes() -> None:
    job = Job(records(30))
    store = InMemoryStateStore()
    harness = job.harness(store)
    plan = FaultPlan().fail(FaultPoint.EMIT, txid=2, attempts=None)
    with pytest.raises(PoisonBatchError) as info:
        harness.run_until_drained(plan, max_attempts=3)

    assert info.value.txid == 2 and info.value.attempts == 3
    assert isinstance(info.value.cause, InjectedFault)
    assert harness.runs[0].injected == [(FaultPoint.EMIT, 2, n) for n in (1, 2, 3)]
    assert store.currtx == 2 and job.sinks[0].counts == Counter(job.data[:10])

    assert not harness.run_until_drained().crashed
    job.assert_exact()


# ---------------------------------------------------------------------- crashes

#: Where the sinks and the store stand after a crash at ``point`` of txid 2, with two
#: committers and one txid in flight: (first sink's txid, second sink's txid, currtx).
CRASH_LEAVES = {
    FaultPoint.AFTER_STORE_META: (1, 1, 2),
    FaultPoint.EMIT: (1, 1, 2),
    FaultPoint.PROCESS: (1, 1, 2),
    FaultPoint.BEFORE_SINK_WRITE: (1, 1, 2),
    FaultPoint.BETWEEN_COMMITTERS: (2, 1, 2),
    FaultPoint.AFTER_SINK_WRITE: (2, 2, 2),
    FaultPoint.AFTER_ADVANCE: (2, 2, 3),
}


@pytest.mark.parametrize("point", list(FaultPoint))
def test_a_crash_ends_the_run_where_it_stands_and_the_next_run_resumes(
    point: FaultPoint,
) -> None:
    job = Job(records(40), sinks=2)
    store = InMemoryStateStore()
    harness = job.harness(store)
    plan = FaultPlan().crash(point, txid=2)

    first = harness.run_until_drained(plan, max_pending=1)

    assert first.crashed and isinstance(first.crash, SimulatedCrash)
    assert (first.crash.point, first.crash.txid, first.crash.number) == (point, 2, 1)
    assert first.injected == [(point, 2, 1)] and plan.crashed == plan.rules
    a, b, currtx = CRASH_LEAVES[point]
    assert (job.sinks[0].last_txid, job.sinks[1].last_txid, store.currtx) == (a, b, currtx)
    spout = job.spouts[0]
    assert [t for t, _ in spout.init_calls] == [1, 2]  # nothing started after the crash
    assert spout.acked == [1] and spout.cleanups == [1]  # no hook ran for txid 2...
    assert spout.failed == []  # ...not even fail(): a killed process calls nothing
    emitted = 0 if point in (FaultPoint.AFTER_STORE_META, FaultPoint.EMIT) else 1
    assert [a.txid for a, _ in spout.emits].count(2) == emitted  # and nothing was retried
    stored_2 = store.metas[2]

    second = harness.run_until_drained(plan, max_pending=1)  # the crash rule is spent

    assert not second.crashed and second.injected == []
    replay = job.spouts[1]
    assert [t for t, _ in replay.init_calls] == [3, 4]
    if currtx == 2:  # txid 2 replayed from its stored metadata, not decided again
        assert replay.emits[0][1] == Range.model_validate(stored_2)
    for sink, last in zip(job.sinks, (a, b), strict=True):
        # Run 1 committed up to ``last``; run 2 commits again from currtx (a skip if held).
        assert sink.committed_sequence() == [*range(1, last + 1), *range(currtx, 5)]
    job.assert_exact()


def test_a_crash_in_a_worker_waits_for_the_commit_in_progress_and_does_not_advance() -> None:
    committing = threading.Event()
    engines: list[InMemoryEngine] = []

    def crash_handled() -> bool:
        """The dead process's runner has cancelled txid 2's job group: it got the crash
        and left its loop (it cancels in flight work on the way out)."""
        return any(g.startswith("txid-2-") for g in engines[0].cancelled)

    class SlowSink(MemoryCommitter):
        def commit(self, attempt: TransactionAttempt, prepared: Counter[Any]) -> CommitOutcome:
            if attempt.txid == 1 and not committing.is_set():
                committing.set()
                # The crash of txid 2 happens, and ends the run, during this write.
                deadline = time.monotonic() + 30
                while not crash_handled():
                    assert time.monotonic() < deadline, "the crash never ended the run"
                    time.sleep(0.001)
            return super().commit(attempt, prepared)

    class WaitingSpout(ListTransactionalSpout):
        def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> list[Any]:  # type: ignore[override]
            if attempt.txid == 2:
                committing.wait(5)
            return super().emit_batch(attempt, meta)

    job = Job(records(30), spout=WaitingSpout)
    job.sinks = [SlowSink()]
    store = InMemoryStateStore()
    harness = job.harness(store)
    assert isinstance(harness.engine, InMemoryEngine)
    engines.append(harness.engine)

    first = harness.run_until_drained(FaultPlan().crash(FaultPoint.PROCESS, txid=2))

    # Returned only once the commit thread stopped: txid 1 is in the sink, but the dead
    # process never advanced the store past it.
    assert first.crashed and first.crash is not None and first.crash.txid == 2
    assert [(a.txid, o) for a, o in job.sinks[0].calls] == [(1, CommitOutcome.APPLIED)]
    assert store.currtx == 1 and store.advances == []

    harness.run_until_drained()
    assert [o for a, o in job.sinks[0].calls if a.txid == 1] == [
        CommitOutcome.APPLIED,
        CommitOutcome.SKIPPED,
    ]
    job.assert_exact()


def test_the_default_store_is_sqlite_in_the_state_dir_and_survives_the_crash(
    tmp_path: Path,
) -> None:
    job = Job(records(35))
    harness = TopologyHarness(
        job.build, engine=InMemoryEngine(), topology_id="words", state_dir=tmp_path
    )
    first = harness.run_until_drained(FaultPlan.parse("crash@after_sink_write:3"), max_pending=2)
    assert first.crashed

    store = SQLiteStateStore(tmp_path / "state.db")
    store.open("words")
    try:
        state = store.read_state()
    finally:
        store.close()
    assert state.currtx == 3 and sorted(state.metas) == [2, 3, 4]
    assert job.sinks[0].last_txid == 3

    assert not harness.run_until_drained().crashed
    assert [o for a, o in job.sinks[0].calls if a.txid == 3][-1] is CommitOutcome.SKIPPED
    job.assert_exact()


def test_a_harness_needs_spark_or_an_engine() -> None:
    with pytest.raises(TypeError, match="SparkSession"):
        TopologyHarness(Job([]).build)


# ---------------------------------------------------------------------- plans as strings


def test_the_documented_plan_string_is_the_plan_in_code() -> None:
    text = "after_sink_write:3:1,emit:7:*,crash@before_sink_write:5"
    in_code = (
        FaultPlan()
        .fail(FaultPoint.AFTER_SINK_WRITE, txid=3, attempts=[1])
        .fail(FaultPoint.EMIT, txid=7, attempts=None)
        .crash(FaultPoint.BEFORE_SINK_WRITE, txid=5)
    )
    assert FaultPlan.parse(text) == in_code
    assert str(in_code) == text


def test_parse_is_lenient_on_spelling_and_writes_back_canonically() -> None:
    plan = FaultPlan.parse(" Emit : 2 : 1-3+5 , crash@After-Advance:4:2 ,process:9")
    assert plan.rules == [
        FaultRule(FaultPoint.EMIT, 2, frozenset({1, 2, 3, 5})),
        FaultRule(FaultPoint.AFTER_ADVANCE, 4, frozenset({2}), crash=True),
        FaultRule(FaultPoint.PROCESS, 9, frozenset({1})),
    ]
    assert str(plan) == "emit:2:1-3+5,crash@after_advance:4:2,process:9:1"
    assert FaultPlan.parse("") == FaultPlan() == FaultPlan.parse("  ")


rules = st.builds(
    FaultRule,
    point=st.sampled_from(list(FaultPoint)),
    txid=st.integers(1, 10_000),
    attempts=st.none() | st.frozensets(st.integers(1, 12), min_size=1, max_size=6),
) | st.builds(
    lambda point, txid, n: FaultRule(point, txid, frozenset({n}), crash=True),
    st.sampled_from(list(FaultPoint)),
    st.integers(1, 10_000),
    st.integers(1, 5),
)


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(st.lists(rules, max_size=6))
def test_parse_reads_back_what_str_writes(generated: list[FaultRule]) -> None:
    plan = FaultPlan(generated)
    assert FaultPlan.parse(str(plan)) == plan


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("emit", "expected POINT:TXID"),
        ("emit:1:1:1", "expected POINT:TXID"),
        ("emit:2,,process:3", "expected POINT:TXID"),
        ("explode:3", "unknown point 'explode'"),
        ("emit:x", "txid 'x' is not an integer >= 1"),
        ("emit:0", "txid '0' is not an integer >= 1"),
        ("emit:-1", "txid '-1' is not an integer >= 1"),
        ("emit:2:0", "attempt '0' is not an integer >= 1"),
        ("emit:2:", "attempt '' is not an integer >= 1"),
        ("emit:2:3-1", "attempt range '3-1' runs backwards"),
        ("emit:2:1+*", "attempt '\\*' is not an integer >= 1"),
        ("crash@emit:2:*", "attempt number of a crash '\\*'"),
        ("crash@emit:2:1+2", "attempt number of a crash '1\\+2'"),
        ("crash@:2", "unknown point ''"),
    ],
)
def test_a_bad_plan_string_says_which_rule_and_how_to_write_one(text: str, complaint: str) -> None:
    with pytest.raises(FaultPlanError, match=complaint) as info:
        FaultPlan.parse(text)
    assert isinstance(info.value, ConfigurationError)
    assert "POINT:TXID[:ATTEMPTS]" in str(info.value) and "after_sink_write" in str(info.value)


def test_rules_built_in_code_are_checked_too() -> None:
    with pytest.raises(FaultPlanError, match="txid must be an integer >= 1"):
        FaultPlan().fail(FaultPoint.EMIT, txid=0)
    with pytest.raises(FaultPlanError, match="attempt numbers >= 1"):
        FaultPlan().fail(FaultPoint.EMIT, txid=1, attempts=[])
    with pytest.raises(FaultPlanError, match="unknown fault point 'sideways'"):
        FaultRule("sideways", 1)  # type: ignore[arg-type]
    with pytest.raises(FaultPlanError, match="happens once"):
        FaultRule(FaultPoint.EMIT, 1, None, crash=True)


# ---------------------------------------------------------------------- the pytest plugin


def test_the_plugin_gives_a_harness_in_tmp_path_and_an_empty_plan_by_default(
    transactional_harness: Callable[..., TopologyHarness],
    transactional_faults: FaultPlan,
    tmp_path: Path,
) -> None:
    job = Job(records(25))
    harness = transactional_harness(job.build, engine=InMemoryEngine(), topology_id="p")
    assert transactional_faults == FaultPlan()

    assert harness.run_until_drained(transactional_faults).stats.committed_txids == 3
    assert harness.state_dir is not None and harness.state_dir.parent == tmp_path
    assert (harness.state_dir / "state.db").is_file()
    job.assert_exact()


def test_a_bad_plan_option_is_a_usage_error() -> None:
    with pytest.raises(pytest.UsageError, match="--transactional-faults: fault rule 'emit:0'"):
        testing_plugin._parse("emit:0")
