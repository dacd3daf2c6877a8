"""The ledger's arithmetic, its plan of a topology and its refusals, without Spark."""

from __future__ import annotations

import logging
from collections import Counter
from functools import reduce
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transactional import Bolt, ConfigurationError, ContractError, TopologyValidationError
from transactional.errors import LedgerError
from transactional.ledger import ID, Tally, drop
from transactional.runtime.ledger_books import _COUNT, AttemptLedger, _BoltBooks, _named
from transactional.runtime.ledger_plan import LedgerPlan, announce
from transactional.testing import ListTransactionalSpout
from transactional.testing.sinks import MemoryCommitter
from transactional.topology import TopologyBuilder

ids = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def tally(records: list[int]) -> Tally:
    return reduce(lambda t, r: t + Tally.of(1, r), records, Tally())


@given(st.lists(ids), st.lists(ids))
def test_tallies_add_as_multisets_do(a: list[int], b: list[int]) -> None:
    assert tally(a + b) == tally(a) + tally(b)
    assert tally(a + b) - tally(b) == tally(a)
    assert tally(a) == tally(list(reversed(a)))  # order-free


@given(st.lists(ids, min_size=1), st.data())
def test_a_record_seen_twice_never_cancels_out(records: list[int], data: Any) -> None:
    """XOR alone cannot tell a record seen twice from one never seen; with the count it
    can: a lost or a duplicated record always changes the tally."""
    twice = data.draw(st.sampled_from(records))
    assert tally([*records, twice, twice]) != tally(records)
    assert tally([*records, twice]).records == len(records) + 1
    lost = data.draw(st.integers(0, len(records) - 1))
    assert tally(records[:lost] + records[lost + 1 :]) != tally(records)


@given(st.lists(ids, min_size=2, unique=True), st.data())
def test_one_lost_and_another_duplicated_is_seen_by_the_xor(records: list[int], data: Any) -> None:
    lost, doubled = data.draw(st.permutations(records))[:2]
    swapped = [r for r in records if r != lost] + [doubled]
    assert Counter(swapped) != Counter(records)
    assert tally(swapped).records == len(records)
    assert tally(swapped) != tally(records)


def test_tally_reads_sparks_nulls_and_signed_longs() -> None:
    assert Tally.of(None, None) == Tally()
    assert Tally.of(1, -1) == Tally(1, 2**64 - 1)
    assert Tally.of(2, -1) - Tally.of(1, -1) == Tally(1, 0)


def test_ledger_error_names_the_bolt_stream_and_number() -> None:
    lost = LedgerError("bolt 'b' (m.B)", "the spout's batch", ("default",), 3, 10, 7)
    assert lost.unaccounted == 3
    assert "bolt 'b' (m.B) on stream 'default', txid 3: 3 record(s) unaccounted for" in str(lost)
    twice = LedgerError("bolt 'b' (m.B)", "stream parse:default", ("x", "y"), 3, 10, 12)
    assert twice.unaccounted == -2 and isinstance(twice, ContractError)
    assert "streams 'x' and 'y' together, txid 3: 2 record(s) accounted for more than once" in (
        str(twice)
    )
    swapped = LedgerError("bolt 'b' (m.B)", "the spout's batch", ("default",), 3, 10, 10)
    assert "not the same ones" in str(swapped)


def test_ledger_error_names_at_most_five_records_and_how_many_in_all() -> None:
    lost = [f"partition {p} offset {o}" for p, o in ((0, 3), (0, 4), (0, 9), (1, 0), (1, 7))]
    error = LedgerError(
        "bolt 'b' (m.B)", "the spout's batch", ("default",), 3, 20, 13, tuple(lost), 7
    )
    assert (error.named, error.miscounted) == (tuple(lost), 7)
    assert (
        "txid 3: 7 record(s) unaccounted for (partition 0 offset 3, partition 0 offset 4, "
        "partition 0 offset 9, partition 1 offset 0, partition 1 offset 7 and 2 more); "
        "given 20 from the spout's batch"
    ) in str(error)
    every = LedgerError(
        "bolt 'b' (m.B)", "the spout's batch", ("default",), 3, 10, 12, ("id=1: 3 times",), 1
    )
    assert "2 record(s) accounted for more than once (id=1: 3 times); given 10" in str(every)


def test_a_record_is_named_by_its_position_else_by_its_values() -> None:
    kafka = {"partition": 2, "offset": 1041, "raw": "x", ID: 7}
    assert _named(kafka, ("partition", "offset"), 1, mixed=False) == "partition 2 offset 1041"
    assert _named(kafka, ("partition", "offset"), 1, mixed=True) == "partition 2 offset 1041: lost"
    redis = {"stream": "clicks", "id": "1700000000000-0"}
    assert _named(redis, ("stream", "id"), -2, mixed=False) == (
        "stream clicks id 1700000000000-0: 3 times"
    )
    assert _named({"file": "a b", "line": 3}, ("file", "line"), 1, False) == "file 'a b' line 3"
    line = '{"user": "ann", "n": 3}'
    assert _named({"raw": line, "error": None, ID: 5}, (), 1, False) == f"raw={line!r}"
    long = "x" * 100
    assert _named({"id": 4, "text": long}, (), -1, False) == f"id=4 text='{'x' * 56}...: 2 times"


def test_records_the_spout_locates_are_named_where_it_says_in_their_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The spout's ``locate`` is asked for rows without the ledger's columns; what it
    places comes first, numbers ordered as numbers; what it cannot, by its values."""
    rows = [
        {"raw": raw, "error": None, ID: i, _COUNT: count}
        for i, (raw, count) in enumerate([("x", 1), ("y", -1), ("z", 1), ("w", 1)])
    ]
    asked: list[list[dict[str, Any]]] = []

    def locate(given: Any) -> list[str | None]:
        asked.append(list(given))
        where = {"x": "file b line 10", "y": "file b line 9", "w": "file a line 200"}
        return [where.get(r["raw"]) for r in given]

    books = AttemptLedger(LedgerPlan(on=True), 1, None, locate=locate)
    assert books._names(rows, mixed=False) == (
        "file a line 200",
        "file b line 9: 2 times",
        "file b line 10",
        "raw='z'",
    )
    assert asked == [[{"raw": r["raw"], "error": None} for r in rows]]

    def fails(given: Any) -> Any:
        raise OSError("the file is gone")

    for broken, why in (
        (fails, "locate raised OSError('the file is gone'): the records are named by"),
        (lambda given: ["one"], "locate answered ['one'] for 2 records, not a text or None"),
    ):
        caplog.clear()
        books = AttemptLedger(LedgerPlan(on=True, spout="spout 'spout' (m.S)"), 4, None)
        books.locate = broken
        with caplog.at_level(logging.WARNING, logger="transactional.ledger"):
            assert books._names(rows[:2], mixed=False) == ("raw='x'", "raw='y': 2 times")
        assert f"ledger txid=4: spout 'spout' (m.S) {why}" in caplog.text
    # Position columns name a record themselves: the spout is not asked.
    kafka = AttemptLedger(LedgerPlan(on=True, position=("p",)), 1, None, locate=fails)
    assert kafka._names([{"p": 3, ID: 1, _COUNT: 1}], mixed=True) == ("p 3: lost",)


class Plain(Bolt):
    def process(self, attempt: Any, batch: Any) -> Any:
        return batch


class Accounting(Bolt):
    accounts = True

    def process(self, attempt: Any, batch: Any) -> Any:
        return batch


class FanOut(Bolt):
    outputs = ("a", "b")
    accounts = True
    routes = (("a",), ("b",))

    def process(self, attempt: Any, batch: Any) -> Any:
        return {"a": batch, "b": batch}


def topology(*bolts: tuple[str, Bolt, str]) -> Any:
    builder = TopologyBuilder().set_spout(ListTransactionalSpout([1, 2], 1))
    for name, bolt, source in bolts:
        builder = builder.set_bolt(name, bolt, source)
    last = bolts[-1][0]
    outputs = bolts[-1][1].outputs
    return builder.set_committer(
        "sink", MemoryCommitter(), {s: f"{last}:{s}" for s in outputs}
    ).build()


def test_the_plan_checks_accounting_bolts_fed_by_checked_ones() -> None:
    plan = LedgerPlan.of(
        topology(("a", Accounting(), "spout"), ("p", Plain(), "a"), ("c", Accounting(), "p")),
        on=True,
    )
    assert plan.accounting == {"a", "c"} and plan.checked == {"a"}
    assert [why for _, why in plan.unchecked] == [
        "does not account for its records",
        "reads 'p', which the ledger does not check",
    ]
    assert plan.record_ids(4) is not None and plan.record_ids(4).txid == 4  # type: ignore[union-attr]
    off = LedgerPlan.of(topology(("a", Accounting(), "spout")), on=False)
    assert off.accounting == {"a"} and off.checked == frozenset() and off.record_ids(1) is None


def test_announce_says_once_or_refuses(caplog: pytest.LogCaptureFixture) -> None:
    plain = topology(("p", Plain(), "spout"))
    with caplog.at_level(logging.WARNING, logger="transactional.ledger"):
        announce(plain, on=True, strict=False)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        f"ledger cannot check bolt 'p' ({__name__}.Plain) does not account for its records"
    ]
    with pytest.raises(ConfigurationError, match=r"\(--ledger-strict\) refuses such bolts"):
        announce(plain, on=True, strict=True)
    with pytest.raises(ConfigurationError, match="the ledger is off"):
        announce(plain, on=False, strict=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="transactional.ledger"):
        announce(topology(("a", Accounting(), "spout")), on=True, strict=True)
        announce(plain, on=False, strict=False)
    assert caplog.records == []


def test_routes_must_name_every_output_once() -> None:
    class Overlapping(FanOut):
        routes = (("a", "b"), ("b",))

    class Missing(FanOut):
        routes = (("a",),)

    for bolt in (Overlapping(), Missing()):
        with pytest.raises(TopologyValidationError, match="must name each of its outputs"):
            topology(("f", bolt, "spout"))
    topology(("f", FanOut(), "spout"))


class Frame:
    """Stands in for a DataFrame: ``drop`` reads its columns only."""

    def __init__(self, *columns: str) -> None:
        self.columns = list(columns)


def books(bolt: Bolt, accounts: bool = True) -> _BoltBooks:
    routes = getattr(bolt, "routes", None) or (tuple(bolt.outputs),)
    return _BoltBooks("bolt 'x' (m.X)", tuple(bolt.outputs), routes, accounts)


def test_drop_records_by_route_and_refuses_what_it_cannot_account() -> None:
    fan = books(FanOut())
    fan.drop(Frame(ID), "no a", "a")
    fan.drop(Frame(ID, "v"), "no b", "b")
    assert [(i, [r for _, r in d]) for i, d in sorted(fan.drops.items())] == [
        (0, ["no a"]),
        (1, ["no b"]),
    ]
    with pytest.raises(ContractError, match=r"name the stream .* stream=\.\.\."):
        fan.drop(Frame(ID), "why", None)
    with pytest.raises(ContractError, match="names no stream of its outputs"):
        fan.drop(Frame(ID), "why", "c")
    with pytest.raises(ContractError, match=r"without transactional\.ledger\.ID"):
        fan.drop(Frame("v"), "why", "a")
    with pytest.raises(ContractError, match="needs a reason"):
        fan.drop(Frame(ID), "", "a")
    one = books(Accounting())
    one.drop(Frame(ID), "why", None)
    assert list(one.drops) == [0]
    with pytest.raises(ContractError, match="does not account for its records"):
        books(Plain(), accounts=False).drop(Frame(ID), "why", None)


def test_drop_outside_a_runner_does_nothing() -> None:
    drop(Frame(ID), "a bolt called directly, in a test")  # type: ignore[arg-type]
