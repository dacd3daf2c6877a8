"""The builder refuses bad wiring at build time, with a message that says what to change."""

from __future__ import annotations

from typing import Any

import pytest

from transactional.bolt import Bolt
from transactional.config import RunnerConfig
from transactional.errors import TopologyValidationError
from transactional.guarantees import check_guarantee, strongest
from transactional.runner import TransactionalRunner
from transactional.testing import (
    CountingBolt,
    InMemoryEngine,
    InMemoryStateStore,
    ListOpaqueSpout,
    ListTransactionalSpout,
    MemoryCommitter,
)
from transactional.topology import TopologyBuilder
from transactional.types import CommitMode, Guarantee, TransactionAttempt


class Split(Bolt):
    outputs = ("good", "bad")

    def process(self, attempt: TransactionAttempt, batch: Any) -> Any:
        return {"good": batch, "bad": []}


def builder() -> TopologyBuilder:
    return TopologyBuilder().set_spout(ListTransactionalSpout([], 1))


def test_a_valid_topology_orders_bolts_after_their_inputs() -> None:
    topology = (
        builder()
        .set_bolt("count", CountingBolt(), input="split:good")
        .set_bolt("split", Split())
        .set_committer("sink", MemoryCommitter(), {"counts": "count", "bad": "split:bad"})
        .build()
    )
    assert [node.name for node in topology.bolts] == ["split", "count"]
    assert dict(topology.committers[0].inputs) == {
        "counts": ("count", "default"),
        "bad": ("split", "bad"),
    }


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (
            lambda b: b.set_committer("sink", MemoryCommitter(), "nowhere"),
            "unknown component 'nowhere'",
        ),
        (
            lambda b: b.set_bolt("split", Split()).set_committer(
                "sink", MemoryCommitter(), "split:ugly"
            ),
            "unknown stream split:ugly",
        ),
        (
            lambda b: (
                b.set_bolt("a", CountingBolt(), input="b")
                .set_bolt("b", CountingBolt(), input="a")
                .set_committer("sink", MemoryCommitter(), "a")
            ),
            "cycle",
        ),
        (lambda b: b.set_bolt("a", CountingBolt()), "no committer"),
    ],
)
def test_bad_wiring_is_refused(wire: Any, message: str) -> None:
    with pytest.raises(TopologyValidationError, match=message):
        wire(builder()).build()


def test_duplicate_and_reserved_names_are_refused() -> None:
    with pytest.raises(TopologyValidationError, match="used twice"):
        builder().set_bolt("a", CountingBolt()).set_bolt("a", CountingBolt())
    with pytest.raises(TopologyValidationError, match="invalid component name"):
        builder().set_bolt("spout", CountingBolt())


def test_an_opaque_spout_needs_opaque_committers_for_exactly_once_only() -> None:
    b = TopologyBuilder().set_spout(ListOpaqueSpout([[]], 1)).set_bolt("count", CountingBolt())
    topology = b.set_committer("sink", MemoryCommitter(CommitMode.TRANSACTIONAL), "count").build()
    with pytest.raises(TopologyValidationError) as refused:
        check_guarantee(topology, Guarantee.EXACTLY_ONCE)
    assert str(refused.value) == (
        "the topology cannot give exactly_once: committer 'sink' "
        "(transactional.testing.sinks.MemoryCommitter) is in transactional mode, but the "
        "spout ListOpaqueSpout is opaque: a replay may emit a different batch, which only an "
        "opaque-mode committer can undo (use its opaque mode, e.g. mode=CommitMode.OPAQUE, "
        "or a non-opaque spout). The strongest guarantee all its parts give is at_least_once "
        "(--guarantee at_least_once), or change the parts above"
    )
    check_guarantee(topology, Guarantee.AT_LEAST_ONCE)  # nothing exact is promised
    check_guarantee(topology, Guarantee.AT_MOST_ONCE)
    ok = TopologyBuilder().set_spout(ListOpaqueSpout([[]], 1)).set_bolt("count", CountingBolt())
    opaque = ok.set_committer("sink", MemoryCommitter(CommitMode.OPAQUE), "count").build()
    check_guarantee(opaque, Guarantee.EXACTLY_ONCE)


class AppendOnly(MemoryCommitter):
    """A sink whose writes are not idempotent per txid."""

    guarantees = frozenset({Guarantee.AT_LEAST_ONCE, Guarantee.AT_MOST_ONCE})


class Unreplayable(ListOpaqueSpout):
    """A source that cannot hand out a batch twice."""

    guarantees = frozenset({Guarantee.AT_MOST_ONCE})


def test_a_part_that_cannot_give_the_guarantee_is_refused_by_name() -> None:
    b = TopologyBuilder().set_spout(ListOpaqueSpout([[]], 1)).set_bolt("count", CountingBolt())
    topology = b.set_committer("log", AppendOnly(CommitMode.OPAQUE), "count").build()
    with pytest.raises(TopologyValidationError) as refused:
        check_guarantee(topology, Guarantee.EXACTLY_ONCE)
    assert str(refused.value) == (
        "the topology cannot give exactly_once: committer 'log' "
        "(tests.unit.test_topology.AppendOnly) gives only at_least_once, at_most_once (its "
        "guarantees attribute). The strongest guarantee all its parts give is at_least_once "
        "(--guarantee at_least_once), or change the parts above"
    )
    check_guarantee(topology, Guarantee.AT_LEAST_ONCE)

    b = TopologyBuilder().set_spout(Unreplayable([[]], 1)).set_bolt("count", CountingBolt())
    topology = b.set_committer("log", AppendOnly(CommitMode.OPAQUE), "count").build()
    for guarantee in (Guarantee.EXACTLY_ONCE, Guarantee.AT_LEAST_ONCE):
        with pytest.raises(
            TopologyValidationError,
            match=r"spout 'spout' \(tests.unit.test_topology.Unreplayable\) gives only at_most_once",
        ):
            check_guarantee(topology, guarantee)
    check_guarantee(topology, Guarantee.AT_MOST_ONCE)
    assert strongest(topology) is Guarantee.AT_MOST_ONCE


def test_a_runner_refuses_a_guarantee_its_parts_cannot_give() -> None:
    b = TopologyBuilder().set_spout(ListOpaqueSpout([[]], 1)).set_bolt("count", CountingBolt())
    topology = b.set_committer("log", AppendOnly(CommitMode.OPAQUE), "count").build()
    with pytest.raises(TopologyValidationError, match="cannot give exactly_once: committer 'log'"):
        TransactionalRunner(
            topology,
            InMemoryStateStore(),
            config=RunnerConfig(topology_id="t"),
            engine=InMemoryEngine(),
        )


def test_not_a_spout_is_refused() -> None:
    with pytest.raises(TopologyValidationError, match="not a spout"):
        TopologyBuilder().set_spout(object())
