"""A topology gives the weakest guarantee of its parts: which guarantees a spout and a
committer can give, and the check that refuses a run asking more of a part than it can.

``RunnerConfig.guarantee`` names what the run promises for each source record:

- ``exactly_once``: every record counted once, whatever fails. Needs a spout that
  replays a stored batch (every spout kind does), committers that are idempotent per
  txid (``Committer.guarantees``), and, for an opaque spout, whose replay may differ,
  committers in opaque mode, which undo a txid's earlier write before applying it.
- ``at_least_once``: nothing lost; a batch replayed after its sink write counts again.
  Needs a spout that replays; any committer.
- ``at_most_once``: nothing counted twice; a batch that fails is dropped (reported,
  never retried). Needs nothing of a spout or committer but that it can say so.

A part declares what it can give with a ``guarantees`` class attribute (every one by
default: the plug-in contracts of ``Spout`` and ``Committer`` are exactly-once ones). A
spout that cannot replay a batch (a socket, a queue that forgets what it handed out)
declares ``frozenset({Guarantee.AT_MOST_ONCE})``; a committer whose writes are not
idempotent (an e-mail, a plain append) ``frozenset({AT_LEAST_ONCE, AT_MOST_ONCE})``.
The check runs when the runner is made (and, in ``transactional run``, before Spark
starts), so a run never begins with a promise it cannot keep.
"""

from __future__ import annotations

from typing import Any

from transactional.contracts import component
from transactional.errors import TopologyValidationError
from transactional.topology import SPOUT, Topology
from transactional.types import CommitMode, Guarantee, SpoutKind

#: Strongest first: the order ``weakest`` reads.
ORDER = (Guarantee.EXACTLY_ONCE, Guarantee.AT_LEAST_ONCE, Guarantee.AT_MOST_ONCE)


def offered(part: Any) -> frozenset[Guarantee]:
    """The guarantees a spout or committer says it can give (its ``guarantees``; all
    for an object that does not say, as a duck-typed committer)."""
    given = getattr(part, "guarantees", None)
    return frozenset(Guarantee) if given is None else frozenset(Guarantee(g) for g in given)


def strongest(topology: Topology) -> Guarantee | None:
    """The strongest guarantee every part of ``topology`` can give (None: no one)."""
    return next((g for g in ORDER if not refusals(topology, g)), None)


def refusals(topology: Topology, guarantee: Guarantee) -> list[str]:
    """Why each part of ``topology`` cannot give ``guarantee`` (empty: all can)."""
    spout = topology.spout
    why = []
    if guarantee not in offered(spout):
        why.append(
            f"{component('spout', SPOUT, spout)} gives only "
            f"{_names(offered(spout))} (its guarantees attribute)"
        )
    for node in topology.committers:
        committer = node.committer
        who = component("committer", node.name, committer)
        if guarantee not in offered(committer):
            why.append(f"{who} gives only {_names(offered(committer))} (its guarantees attribute)")
        elif (
            guarantee is Guarantee.EXACTLY_ONCE
            and spout.kind is SpoutKind.OPAQUE
            and committer.mode is not CommitMode.OPAQUE
        ):
            why.append(
                f"{who} is in {committer.mode.value} mode, but the spout "
                f"{type(spout).__name__} is opaque: a replay may emit a different batch, which "
                "only an opaque-mode committer can undo (use its opaque mode, e.g. "
                "mode=CommitMode.OPAQUE, or a non-opaque spout)"
            )
    return why


def check_guarantee(topology: Topology, guarantee: Guarantee) -> None:
    """Refuse ``guarantee`` when a part of ``topology`` cannot give it, naming each part,
    why, and the strongest guarantee the topology can give."""
    why = refusals(topology, guarantee)
    if not why:
        return
    best = strongest(topology)
    instead = (
        "No guarantee is given by all its parts: change the parts above"
        if best is None
        else f"The strongest guarantee all its parts give is {best.value} (--guarantee "
        f"{best.value}), or change the parts above"
    )
    raise TopologyValidationError(
        f"the topology cannot give {guarantee.value}: " + "; ".join(why) + f". {instead}"
    )


def _names(guarantees: frozenset[Guarantee]) -> str:
    return ", ".join(g.value for g in ORDER if g in guarantees) or "none"
