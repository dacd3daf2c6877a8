"""The invariants of DESIGN.md section 4, asserted on the state machine after every step:
a breach is a bug in the machine (``InvariantError``), never a user's error."""

from __future__ import annotations

from typing import TYPE_CHECKING

from transactional.runtime.state import InvariantError, SlotState

if TYPE_CHECKING:
    from transactional.runtime.machine import Machine

_COMMIT_STATES = (SlotState.COMMITTING, SlotState.ADVANCING)


def check_invariants(machine: Machine) -> None:
    """At most ``max_pending`` txids in flight (or a pinned group's size), all inside the
    window from ``currtx`` and below the next txid to start; at most one commit, of
    ``currtx`` and the txids after it in its (pinned) group; the pinned group starts at
    ``currtx``. (That a new group is at most ``max_group`` is checked where groups are
    formed, by the tests.)"""
    currtx, slots = machine.currtx, machine.slots
    window = range(currtx, currtx + machine.window())
    problems = []
    if len(slots) > len(window):
        problems.append(f"{len(slots)} txids in flight")
    if any(t not in window for t in slots):
        problems.append(f"in flight {sorted(slots)} outside the window {window}")
    if not currtx <= machine.next_txid <= window.stop:
        problems.append(f"next txid {machine.next_txid} outside {window}")
    if any(t >= machine.next_txid for t in slots):
        problems.append(f"in flight {sorted(slots)} at or past {machine.next_txid}")
    if machine.committing is not None and machine.committing != currtx:
        problems.append(f"committing {machine.committing} with currtx={currtx}")
    busy = sorted(s.txid for s in slots.values() if s.state in _COMMIT_STATES)
    pinned = machine.pinned
    if machine.committing is not None and pinned is None:
        problems.append(f"committing {machine.committing} with no pinned group")
    last = pinned[1] if machine.committing is not None and pinned is not None else None
    group = [] if last is None else list(range(currtx, last + 1))
    if busy and (busy != group or machine.committing != currtx):
        problems.append(f"commits of {busy} with currtx={currtx}, committing up to {last}")
    if pinned is not None and pinned[0] != currtx:
        problems.append(f"pinned group {pinned} does not start at currtx={currtx}")
    if problems:
        raise InvariantError("; ".join(problems))
