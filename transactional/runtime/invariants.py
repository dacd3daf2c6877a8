"""The invariants of docs/architecture.md, "The protocol", asserted on the state machine
after every step: a breach is a bug in the machine (``InvariantError``), never a user's
error."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from transactional.runtime.state import InvariantError, Slot, SlotState

_COMMIT_STATES = (SlotState.COMMITTING, SlotState.ADVANCING)


class Checked(Protocol):
    """What the invariants read of the machine (``machine.Machine``)."""

    @property
    def currtx(self) -> int: ...
    @property
    def next_txid(self) -> int: ...
    @property
    def slots(self) -> Mapping[int, Slot]: ...
    @property
    def commits(self) -> Sequence[tuple[int, int]]: ...
    @property
    def pinned(self) -> tuple[int, int] | None: ...
    @property
    def overlap(self) -> int: ...
    def window(self) -> int: ...


def check_invariants(machine: Checked) -> None:
    """Raise ``InvariantError`` naming each invariant that does not hold; beside the
    protocol's, the machine's own bookkeeping: the txids committing or advancing are
    exactly the running commits', and the pinned group starts at ``currtx`` and, while
    commits run, is the first's. (That a new group is at most ``max_group`` is checked
    where groups are formed, by the tests.)"""
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
    commits, pinned = machine.commits, machine.pinned
    if len(commits) > machine.overlap:
        problems.append(f"{len(commits)} commits running, overlap {machine.overlap}")
    starts = [currtx, *(b + 1 for _, b in commits)][: len(commits)]
    if [a for a, _ in commits] != starts or any(a > b for a, b in commits):
        problems.append(f"commits {commits} with currtx={currtx}")
    if any(a != b for a, b in commits[1:]):
        problems.append(f"commits {commits}: a group after the first")
    busy = sorted(s.txid for s in slots.values() if s.state in _COMMIT_STATES)
    if busy != [t for a, b in commits for t in range(a, b + 1)]:
        problems.append(f"commits of {busy} with currtx={currtx}, committing {commits}")
    if commits and pinned != commits[0]:
        problems.append(f"committing {commits} with pinned group {pinned}")
    if pinned is not None and pinned[0] != currtx:
        problems.append(f"pinned group {pinned} does not start at currtx={currtx}")
    if problems:
        raise InvariantError("; ".join(problems))
