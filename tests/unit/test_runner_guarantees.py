"""The weaker guarantees on in-memory doubles: a fault at each step of the protocol, an
exception or a crash, then a run to the end; what the sinks hold is checked against an
answer computed from the data and from what the store and the sinks held at the fault,
never from what the runner says.

- ``at_least_once``: nothing is lost; the records counted twice are exactly those of
  the txids the sink held and the store had not advanced past (replayed after their
  sink write).
- ``at_most_once``: nothing is counted twice; what is missing is exactly the batches of
  the txids reported dropped, and those are the txids the store held as started and the
  sinks did not hold.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from transactional.config import RunnerConfig
from transactional.faults import FaultPoint
from transactional.runner import RunStats, TransactionalRunner
from transactional.testing import (
    FaultPlan,
    FaultRule,
    InMemoryEngine,
    InMemoryStateStore,
    ListOpaqueSpout,
    ListPartitionedSpout,
    ListTransactionalSpout,
    MemoryCommitter,
    SimulatedCrash,
    counting_topology,
)
from transactional.types import CommitMode, Guarantee

BATCH = 6
TOTAL = 48  # txids 1..8
TARGET = 3
#: Two committers: the second write of a txid can fail after the first.
SINKS = 2


def data() -> list[str]:
    return [f"r{i % 5}-{i // 5}" for i in range(TOTAL)]


def batch_of(txid: int) -> Counter[str]:
    """Txid ``txid``'s records, as a list spout of ``BATCH`` cuts the data (partitioned
    spouts: two partitions, each cut alike, numbered from the same txid)."""
    return Counter(data()[(txid - 1) * BATCH : txid * BATCH])


def spout_of(kind: str) -> Any:
    if kind == "transactional":
        return ListTransactionalSpout(data(), BATCH)
    if kind == "partitioned":
        rows = data()
        return ListPartitionedSpout([rows[0::2], rows[1::2]], BATCH // 2)
    return ListOpaqueSpout([data()], BATCH)


def run(
    kind: str,
    guarantee: Guarantee,
    store: InMemoryStateStore,
    sinks: list[MemoryCommitter],
    faults: FaultPlan | None = None,
) -> RunStats:
    config = RunnerConfig(
        topology_id="t",
        guarantee=guarantee,
        max_pending=3,
        max_group=1,
        backoff_initial_s=0.0,
        backoff_max_s=0.0,
        poll_interval_s=0.01,
    )
    runner = TransactionalRunner(
        counting_topology(spout_of(kind), *sinks),
        store,
        config=config,
        engine=InMemoryEngine(),
        faults=faults,
    )
    try:
        return runner.run(until_drained=True)
    finally:
        runner.join()


def sinks_for(kind: str) -> list[MemoryCommitter]:
    mode = CommitMode.TRANSACTIONAL
    return [MemoryCommitter(mode) for _ in range(SINKS)]


def started_not_advanced(store: InMemoryStateStore) -> set[int]:
    """What the store held as started and not committed: read from the store itself."""
    return {t for t in store.metas if t >= store.currtx}


def by_batches(txids: set[int]) -> Counter[str]:
    total: Counter[str] = Counter()
    for txid in txids:
        total.update(batch_of(txid))
    return total


KINDS = ("transactional", "partitioned", "opaque")
POINTS = tuple(FaultPoint)


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kind", KINDS)
def test_at_least_once_after_a_crash_loses_nothing_and_counts_twice_exactly_what_was_written(
    kind: str, point: FaultPoint
) -> None:
    store, sinks = InMemoryStateStore(), sinks_for(kind)
    crash = FaultPlan([FaultRule(point, TARGET, crash=True)])
    with pytest.raises(SimulatedCrash):  # the crash fired
        run(kind, Guarantee.AT_LEAST_ONCE, store, sinks, crash)
    pending = started_not_advanced(store)
    held = [{t for t in pending if t <= sink.last_txid} for sink in sinks]

    run(kind, Guarantee.AT_LEAST_ONCE, store, sinks)

    for sink, written in zip(sinks, held, strict=True):
        assert sink.counts == Counter(data()) + by_batches(written)
        twice = {t for t, n in Counter(sink.applied).items() if n > 1}
        assert twice == written
    if point is FaultPoint.AFTER_SINK_WRITE:
        assert held == [{TARGET}] * SINKS  # the case that counts twice happened
    if point is FaultPoint.BETWEEN_COMMITTERS:
        assert held == [{TARGET}, set()]


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kind", KINDS)
def test_at_least_once_after_an_exception_replays_and_counts_twice_what_was_written(
    kind: str, point: FaultPoint
) -> None:
    store, sinks = InMemoryStateStore(), sinks_for(kind)
    fault = FaultPlan([FaultRule(point, TARGET)])
    stats = run(kind, Guarantee.AT_LEAST_ONCE, store, sinks, fault)
    assert stats.failures == (0 if point is FaultPoint.AFTER_ADVANCE else 1)
    # After every sink wrote it, or after the first: written, failed, written again.
    again = {
        FaultPoint.AFTER_SINK_WRITE: [{TARGET}] * SINKS,
        FaultPoint.BETWEEN_COMMITTERS: [{TARGET}, set()],
    }.get(point, [set()] * SINKS)
    for sink, twice in zip(sinks, again, strict=True):
        assert sink.counts == Counter(data()) + by_batches(twice)
        assert {t for t, n in Counter(sink.applied).items() if n > 1} == twice


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kind", KINDS)
def test_at_most_once_after_a_crash_counts_nothing_twice_and_loses_exactly_what_it_dropped(
    kind: str, point: FaultPoint
) -> None:
    store, sinks = InMemoryStateStore(), sinks_for(kind)
    crash = FaultPlan([FaultRule(point, TARGET, crash=True)])
    with pytest.raises(SimulatedCrash):
        run(kind, Guarantee.AT_MOST_ONCE, store, sinks, crash)
    pending = started_not_advanced(store)
    in_every_sink = {t for t in pending if all(t <= s.last_txid for s in sinks)}
    lost_in = [pending - {t for t in pending if t <= s.last_txid} for s in sinks]

    stats = run(kind, Guarantee.AT_MOST_ONCE, store, sinks)

    assert stats.dropped_txids == len(pending - in_every_sink)
    assert stats.dropped_records == 0  # dropped at the restart: never counted
    for sink, lost in zip(sinks, lost_in, strict=True):
        assert sink.counts == Counter(data()) - by_batches(lost)
        assert max(Counter(sink.applied).values()) == 1  # nothing twice
    if point is not FaultPoint.AFTER_ADVANCE and point is not FaultPoint.AFTER_SINK_WRITE:
        assert TARGET in pending - in_every_sink  # the crashed txid was dropped


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kind", KINDS)
def test_at_most_once_drops_a_failed_txid_for_good_and_reports_it(
    kind: str, point: FaultPoint
) -> None:
    store, sinks = InMemoryStateStore(), sinks_for(kind)
    fault = FaultPlan([FaultRule(point, TARGET, attempts=None)])  # it would fail every time
    stats = run(kind, Guarantee.AT_MOST_ONCE, store, sinks, fault)

    written_before = point in (FaultPoint.AFTER_SINK_WRITE, FaultPoint.AFTER_ADVANCE)
    # Between the committers: the first sink holds the txid, the second never will.
    lost_in = [
        set() if written_before or (point is FaultPoint.BETWEEN_COMMITTERS and i == 0) else {TARGET}
        for i in range(SINKS)
    ]
    for sink, lost in zip(sinks, lost_in, strict=True):
        assert sink.counts == Counter(data()) - by_batches(lost)
        assert max(Counter(sink.applied).values()) == 1
    dropped = not written_before
    assert stats.dropped_txids == int(dropped)
    counted = point in (FaultPoint.BEFORE_SINK_WRITE, FaultPoint.BETWEEN_COMMITTERS)
    assert stats.dropped_records == (sum(batch_of(TARGET).values()) if counted else 0)
    assert stats.committed_txids == TOTAL // BATCH - int(dropped)
    assert store.currtx == TOTAL // BATCH + 1  # the store moved past it: never replayed
