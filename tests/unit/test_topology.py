"""The builder refuses bad wiring at build time, with a message that says what to change."""

from __future__ import annotations

from typing import Any

import pytest

from transactional.bolt import Bolt
from transactional.errors import TopologyValidationError
from transactional.testing import (
    CountingBolt,
    ListOpaqueSpout,
    ListTransactionalSpout,
    MemoryCommitter,
)
from transactional.topology import TopologyBuilder
from transactional.types import CommitMode, TransactionAttempt


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


def test_an_opaque_spout_needs_opaque_committers() -> None:
    b = TopologyBuilder().set_spout(ListOpaqueSpout([[]], 1)).set_bolt("count", CountingBolt())
    b.set_committer("sink", MemoryCommitter(CommitMode.TRANSACTIONAL), "count")
    with pytest.raises(TopologyValidationError, match="opaque"):
        b.build()
    ok = TopologyBuilder().set_spout(ListOpaqueSpout([[]], 1)).set_bolt("count", CountingBolt())
    ok.set_committer("sink", MemoryCommitter(CommitMode.OPAQUE), "count").build()


def test_not_a_spout_is_refused() -> None:
    with pytest.raises(TopologyValidationError, match="not a spout"):
        TopologyBuilder().set_spout(object())
