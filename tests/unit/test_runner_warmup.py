"""The warm-up before the first txid (``RunnerConfig.warm_up``): the spout's sample goes
through the bolts and every committer's ``prepare`` as txid 0, is never stored or
committed, and changes no result; a broken contract found there stops the run before
any txid is stored; any other failure of the warm-up only costs the warm-up. By default
only a run with adaptive batch sizes warms up; these tests ask for it (``warm_up=True``)
unless they say otherwise."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from transactional.bolt import Bolt
from transactional.config import RunnerConfig
from transactional.errors import ContractError
from transactional.flow import AdaptiveBatchSize
from transactional.runner import TransactionalRunner
from transactional.testing import (
    CountingBolt,
    InMemoryEngine,
    InMemoryStateStore,
    ListPartitionedSpout,
    ListTransactionalSpout,
    MemoryCommitter,
    counting_topology,
)
from transactional.topology import TopologyBuilder
from transactional.types import TransactionAttempt

DATA = [f"r{i % 7}" for i in range(45)]


class Sampled(ListTransactionalSpout):
    """A list spout whose sample is its first ``sample`` records (or ``broken``: what
    ``sample_batch`` raises or returns instead)."""

    def __init__(self, records: list[Any], batch_size: int, sample: int = 5) -> None:
        super().__init__(records, batch_size)
        self.sample, self.samples = sample, 0
        self.broken: Any = None

    def sample_batch(self) -> Any:
        self.samples += 1
        if isinstance(self.broken, Exception):
            raise self.broken
        return self.broken if self.broken is not None else self.records[: self.sample]


class SampledPartitions(ListPartitionedSpout):
    def sample_batch(self) -> Any:
        return self.partitions[0][:3]


class Seen(CountingBolt):
    """Records every batch it is given, by txid."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[Any]]] = []

    def process(self, attempt: TransactionAttempt, batch: list[Any]) -> Any:
        self.batches.append((attempt.txid, list(batch)))
        return super().process(attempt, batch)


def run(
    spout: Any,
    *committers: MemoryCommitter,
    bolt: Bolt | None = None,
    batch_size: AdaptiveBatchSize | None = None,
    **config: Any,
) -> tuple[TransactionalRunner, InMemoryStateStore]:
    builder = TopologyBuilder().set_spout(spout).set_bolt("count", bolt or CountingBolt())
    for i, committer in enumerate(committers):
        builder.set_committer(f"sink{i}", committer, "count")
    store = InMemoryStateStore()
    settings: dict[str, Any] = {
        "topology_id": "t", "max_pending": 2, "poll_interval_s": 0.01, "warm_up": True,
    }  # fmt: skip
    runner = TransactionalRunner(
        builder.build(),
        store,
        config=RunnerConfig(**settings | config),
        engine=InMemoryEngine(),
        batch_size=batch_size,
    )
    runner.run(until_drained=True)
    return runner, store


def test_the_sample_goes_through_bolts_and_prepare_as_txid_0_and_is_never_committed() -> None:
    spout = Sampled(DATA, 10, sample=6)
    bolt = Seen()
    first, second = MemoryCommitter(), MemoryCommitter()
    runner, store = run(spout, first, second, bolt=bolt, max_pending=1)
    assert spout.samples == 1
    # The bolt saw the sample first, as txid 0, then every batch of the data in order.
    assert bolt.batches[0] == (0, DATA[:6])
    assert sorted(t for t, _ in bolt.batches[1:]) == [1, 2, 3, 4, 5]
    for committer in (first, second):
        assert committer.prepared[0].txid == 0
        assert sorted(a.txid for a in committer.prepared[1:]) == [1, 2, 3, 4, 5]
        # Nothing of txid 0 reached a sink: every record counted once.
        assert committer.counts == dict(Counter(DATA))
        assert 0 not in {a.txid for a, _ in committer.calls}
        assert committer.last_txid == 5
    # The store never saw txid 0 either: the spout's first txid was decided from nothing.
    assert spout.init_calls[0] == (1, None)
    assert store.read_state().currtx == 6
    # Its Spark jobs say so in the UI, before the first txid's.
    assert runner.engine.descriptions[:2] == [
        "t warm-up (txid 0, not stored)",
        "t txid=1 attempt=1 step=emit",
    ]


def test_without_warm_up_the_sample_is_never_asked_for() -> None:
    spout = Sampled(DATA, 10)
    committer = MemoryCommitter()
    run(spout, committer, warm_up=False)
    assert spout.samples == 0
    assert [a.txid for a in committer.prepared] == [1, 2, 3, 4, 5]
    assert committer.counts == dict(Counter(DATA))


@pytest.mark.parametrize("adaptive", [False, True])
def test_by_default_only_adaptive_batch_sizes_warm_up(adaptive: bool) -> None:
    spout = Sampled(DATA, 10)
    committer = MemoryCommitter()
    run(spout, committer, batch_size=AdaptiveBatchSize() if adaptive else None, warm_up=None)
    assert spout.samples == (1 if adaptive else 0)
    prepared = [a.txid for a in committer.prepared]
    assert (0 in prepared) is adaptive
    assert committer.counts == dict(Counter(DATA))


def test_a_spout_without_a_sample_has_no_warm_up() -> None:
    spout = ListTransactionalSpout(DATA, 10)
    committer = MemoryCommitter()
    run(spout, committer)
    assert 0 not in {a.txid for a in committer.prepared}
    assert committer.counts == dict(Counter(DATA))


def test_partitioned_spouts_warm_up_too() -> None:
    partitions = [DATA[:20], DATA[20:]]
    spout = SampledPartitions(partitions, 4)
    committer = MemoryCommitter()
    run(spout, committer)
    assert committer.prepared[0].txid == 0
    assert committer.counts == dict(Counter(DATA))


class NotAFrame(Bolt):
    def process(self, attempt: TransactionAttempt, batch: Any) -> Any:
        return 42


def test_a_broken_contract_stops_the_run_before_any_txid_is_stored() -> None:
    spout = Sampled(DATA, 10)
    committer = MemoryCommitter()
    with pytest.raises(ContractError) as info:
        run(spout, committer, bolt=NotAFrame())
    text = str(info.value)
    assert "bolt 'count'" in text and "NotAFrame" in text
    assert "warm-up" in "\n".join(info.value.__notes__)
    assert spout.init_calls == []  # no txid decided
    assert committer.calls == []


def test_a_sample_that_is_not_a_frame_is_a_contract_error_naming_sample_batch() -> None:
    spout = Sampled(DATA, 10)
    spout.broken = {"not": "rows"}
    engine = InMemoryEngine()
    assert not engine.is_frame(spout.broken)
    with pytest.raises(ContractError, match=r"spout .*Sampled.*\.sample_batch returned"):
        run(spout, MemoryCommitter())
    assert spout.init_calls == []


def test_any_other_failure_costs_only_the_warm_up(caplog: pytest.LogCaptureFixture) -> None:
    spout = Sampled(DATA, 10)
    spout.broken = OSError("sample source unreachable")
    committer = MemoryCommitter()
    with caplog.at_level(logging.WARNING, logger="transactional.runner"):
        run(spout, committer)
    assert any(
        "warm-up failed" in r.getMessage() and "sample source unreachable" in r.getMessage()
        for r in caplog.records
    )
    assert [a.txid for a in committer.prepared] == [1, 2, 3, 4, 5]
    assert committer.counts == dict(Counter(DATA))


class Once(MemoryCommitter):
    """Raises from ``prepare`` of the warm-up (txid 0) only."""

    def prepare(self, attempt: TransactionAttempt, inputs: Mapping[str, Any]) -> Counter[Any]:
        if attempt.txid == 0:
            raise RuntimeError("cold cache")
        return super().prepare(attempt, inputs)


def test_a_prepare_failing_in_the_warm_up_does_not_fail_the_run() -> None:
    committer = Once()
    _, store = run(Sampled(DATA, 10), committer)
    assert committer.counts == dict(Counter(DATA))
    assert store.read_state().currtx == 6


def test_counting_topology_is_unchanged_by_a_warm_up() -> None:
    """The toolkit's topology, warmed and not, holds the same counts."""
    results = []
    for warm in (True, False):
        committer = MemoryCommitter()
        store = InMemoryStateStore()
        TransactionalRunner(
            counting_topology(Sampled(DATA, 8), committer),
            store,
            config=RunnerConfig(topology_id="t", warm_up=warm, poll_interval_s=0.01),
            engine=InMemoryEngine(),
        ).run(until_drained=True)
        results.append(committer.counts)
    assert results[0] == results[1] == dict(Counter(DATA))
