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
    ``currtx`` and the txids after it in its group, no larger than ``max_group`` unless
    pinned from an earlier run; the pinned group starts at ``currtx``."""
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
    last = machine.committing_last
    group = [] if last is None else list(range(currtx, last + 1))
    if busy and (busy != group or machine.committing != currtx):
        problems.append(f"commits of {busy} with currtx={currtx}, committing up to {last}")
    size = 0 if last is None else last - currtx + 1
    if size > max(machine.settings.max_group, 1) and machine.pinned != (currtx, last):
        problems.append(f"a commit group of {size} txids above max_group")
    pinned = machine.pinned
    if pinned is not None and pinned[0] != currtx:
        problems.append(f"pinned group {pinned} does not start at currtx={currtx}")
    if problems:
        raise InvariantError("; ".join(problems))
