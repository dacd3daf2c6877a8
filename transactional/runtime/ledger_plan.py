"""What the record ledger does for one topology, decided before its first txid: which
bolts it checks, their routes, how the batch's records get their ids; said once at
start (``announce``). The ledger: docs/concepts/ledger.md."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transactional.contracts import component
from transactional.errors import ConfigurationError
from transactional.spark.ids import RecordIds
from transactional.topology import SPOUT, Topology

log = logging.getLogger("transactional.ledger")


def routes_of(bolt: Any) -> tuple[tuple[str, ...], ...]:
    """The bolt's routes: its ``routes``, or one route of all its outputs."""
    routes = getattr(bolt, "routes", None)
    return tuple(tuple(r) for r in routes) if routes else (tuple(bolt.outputs),)


@dataclass(frozen=True)
class LedgerPlan:
    """What the ledger does for one topology, decided before the first txid.

    ``accounting``: bolts whose class sets ``accounts`` (their input always has ``ID``);
    ``checked``: those the ledger balances (the ledger is on, and their input is the
    spout's batch or a stream of a checked bolt); ``unchecked``: every other bolt, with
    why, as the start-up message names them."""

    on: bool
    accounting: frozenset[str] = frozenset()
    checked: frozenset[str] = frozenset()
    unchecked: tuple[tuple[str, str], ...] = ()
    routes: Mapping[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)
    position: tuple[str, ...] = ()
    spout: str = "spout"

    @classmethod
    def of(cls, topology: Topology, on: bool) -> LedgerPlan:
        accounting, checked, unchecked = set(), set(), []
        for node in topology.bolts:
            who = component("bolt", node.name, node.bolt)
            upstream = node.input[0]
            if not getattr(node.bolt, "accounts", False):
                unchecked.append((who, "does not account for its records"))
                continue
            accounting.add(node.name)
            if upstream == SPOUT or upstream in checked:
                checked.add(node.name)
            else:
                unchecked.append((who, f"reads {upstream!r}, which the ledger does not check"))
        spout = topology.spout
        return cls(
            on=on,
            accounting=frozenset(accounting),
            checked=frozenset(checked) if on else frozenset(),
            unchecked=tuple(unchecked),
            routes={n.name: routes_of(n.bolt) for n in topology.bolts if n.name in accounting},
            position=tuple(getattr(spout, "position_columns", ()) or ()),
            spout=component("spout", SPOUT, spout),
        )

    def record_ids(self, txid: int) -> RecordIds | None:
        """The ids to give the batch of ``txid``; None: no bolt is checked."""
        if not self.checked:
            return None
        return RecordIds(txid, self.position, self.spout)


#: How a bolt that does not account is let in, for the start-up message.
HOW = (
    "set accounts = True on its class and account for each record: keep "
    "transactional.ledger.ID in a row-wise output, add *folded() to an agg(...), send it "
    "to a dead-letter stream with its ID, or drop_where(output, condition, reason) or "
    "drop(input_rows, reason)"
)


def announce(topology: Topology, on: bool, strict: bool) -> LedgerPlan:
    """Once, at start: which bolts the ledger cannot check and how to let it; with
    ``strict``, refuse them (``ConfigurationError``, before anything is stored)."""
    if strict and not on:
        raise ConfigurationError(
            "ledger_strict (--ledger-strict) refuses bolts the ledger cannot check, but the "
            "ledger is off (--no-ledger): turn the ledger on or drop --ledger-strict"
        )
    plan = LedgerPlan.of(topology, on)
    if not on or not plan.unchecked:
        return plan
    names = "; ".join(f"{who} {why}" for who, why in plan.unchecked)
    if strict:
        raise ConfigurationError(
            f"the ledger cannot check {names}, and ledger_strict (--ledger-strict) refuses "
            f"such bolts: {HOW}; or run without --ledger-strict"
        )
    log.warning(
        "ledger cannot check %s: they run as before, unchecked. To let it: %s "
        "(--ledger-strict refuses such bolts)",
        names,
        HOW,
    )
    return plan
