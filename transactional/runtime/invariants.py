"""The invariants of DESIGN.md section 4, asserted on the state machine after every step:
a breach is a bug in the machine (``InvariantError``), never a user's error."""

from __future__ import annotations

from typing import TYPE_CHECKING

from transactional.runtime.state import InvariantError, SlotState

if TYPE_CHECKING:
    from transactional.runtime.machine import Machine

_COMMIT_STATES = (SlotState.COMMITTING, SlotState.ADVANCING)


def check_invariants(machine: Machine) -> None:
    """At most ``max_pending`` txids in flight, all inside the window ``[currtx, currtx +
    max_pending)`` and below the next txid to start; at most one commit, of ``currtx``."""
    currtx, slots = machine.currtx, machine.slots
    window = range(currtx, currtx + machine.settings.max_pending)
    problems = []
    if len(slots) > machine.settings.max_pending:
        problems.append(f"{len(slots)} txids in flight")
    if any(t not in window for t in slots):
        problems.append(f"in flight {sorted(slots)} outside the window {window}")
    if not currtx <= machine.next_txid <= window.stop:
        problems.append(f"next txid {machine.next_txid} outside {window}")
    if any(t >= machine.next_txid for t in slots):
        problems.append(f"in flight {sorted(slots)} at or past {machine.next_txid}")
    if machine.committing is not None and machine.committing != currtx:
        problems.append(f"committing {machine.committing} with currtx={currtx}")
    busy = [s.txid for s in slots.values() if s.state in _COMMIT_STATES]
    if busy and (busy != [currtx] or machine.committing != currtx):
        problems.append(f"commits of {busy} with currtx={currtx}")
    if problems:
        raise InvariantError("; ".join(problems))
