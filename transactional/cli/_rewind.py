"""``transactional rewind``: a topology and its sinks back to a committed txid, so that
the txids after it are processed again from the source.

The order makes it safe to interrupt anywhere: leadership first (no runner commits
while it runs); every sink's rollback decided (a sink that cannot roll back, or has no
version at the txid, refuses before anything is written); the rewind recorded in the
store, after which no run starts; the sinks rolled back; then the store, in one write,
moved back (``currtx = txid + 1``, later txids forgotten) and the record cleared. Run
again after a crash, it finishes the same rewind: a sink already rolled back is left as
it is.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from transactional.cli._factories import topology_without_spark
from transactional.errors import ConfigurationError, LostLeadershipError
from transactional.store import open_store

__all__ = ["CRASH_POINTS", "rewind"]

#: Where ``--crash-at`` SIGKILLs a rewind, for crash tests: after the store records it,
#: after the sinks rolled back.
CRASH_POINTS = ("recorded", "sinks")


def _crash(point: str, crash_at: str | None) -> None:
    if crash_at == point:
        os.kill(os.getpid(), signal.SIGKILL)


def rewind(
    spec: str,
    topology_id: str,
    where: tuple[str | None, str, str | None, float],
    txid: int,
    crash_at: str | None = None,
    wait: float = 5.0,
) -> list[str]:
    """Rewind ``topology_id`` (the factory ``spec``'s topology, its store at ``where``)
    to ``txid``; what was done, one line per step."""
    if txid < 0:
        raise ConfigurationError(f"--to {txid}: a txid is 0 (before the first) or above")
    topology = topology_without_spark(spec, "rewind")
    # Each sink is asked first, before the store is touched: a sink that cannot roll
    # back refuses with nothing written anywhere.
    for node in topology.committers:
        node.committer.rollback(topology_id, node.name, txid)
    store = open_store(*where)
    if topology_id not in store.topology_ids():
        raise ConfigurationError(f"the state store holds no topology {topology_id!r}")
    store.open(topology_id)
    try:
        try:
            store.acquire_leadership(timeout=wait)
        except LostLeadershipError as exc:
            raise ConfigurationError(
                f"a runner leads topology {topology_id!r}: stop it before rewinding ({exc})"
            ) from exc
        state = store.read_state()
        # Decided again under leadership: nothing commits from here on.
        plans: list[tuple[str, Any]] = [
            (node.name, node.committer.rollback(topology_id, node.name, txid))
            for node in topology.committers
        ]
        store.begin_rewind(txid)
        _crash("recorded", crash_at)
        done = [f"rewinding {topology_id!r} from txid {state.currtx - 1} to txid {txid}"]
        for name, plan in plans:
            plan.apply()
            done += [f"committer {name!r}: {step}" for step in plan.steps]
        _crash("sinks", crash_at)
        store.finish_rewind(txid)
        done.append(f"state store: currtx is {txid + 1}; the next run starts there")
        return done
    finally:
        store.close()
