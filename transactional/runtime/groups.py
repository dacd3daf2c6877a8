"""Which txids the state machine commits together (commit groups), kept apart from its
handlers: the pinned group, the next group to commit, and the window it widens.

See ``transactional.runtime.machine`` for the rule, and ``docs/architecture.md``
(Commit groups) for why a recorded group must be committed again exactly.
"""

from __future__ import annotations

from transactional.config import RunnerConfig
from transactional.runtime.state import Slot, SlotState

#: The states of a txid still being processed: a group may wait for it.
_PROCESSING = (SlotState.PROCESSING, SlotState.VERIFYING)


class CommitGroups:
    """The machine's group decisions (a mixin of ``Machine``, over its state)."""

    settings: RunnerConfig
    currtx: int
    slots: dict[int, Slot]
    commits: list[tuple[int, int]]
    pinned: tuple[int, int] | None

    def window(self) -> int:
        """How many txids may be in flight: ``max_pending``, or the pinned group's size
        if a run with a larger ``max_pending`` recorded it."""
        if self.pinned is None:
            return self.settings.max_pending
        return max(self.settings.max_pending, self.pinned[1] - self.pinned[0] + 1)

    def _next_group(self, now: float) -> list[Slot]:
        """The slots to commit now, from ``currtx``: exactly the pinned group once all
        of it is processed; else the processed, groupable txids in a row, at most
        ``max_group``, once the next is not one still processing that ``group_wait_s``
        lets them wait for. While commits run (overlapping commits): the txid after the
        last of them, alone, once processed (the store records one group: the first's).
        Empty: nothing to commit yet."""
        if self.commits:
            after = self.slots.get(self.commits[-1][1] + 1)
            return [after] if after is not None and after.state is SlotState.PROCESSED else []
        if self.pinned is not None:
            txids = range(self.pinned[0], self.pinned[1] + 1)
            found = [self.slots.get(t) for t in txids]
            ready = [s for s in found if s is not None and s.state is SlotState.PROCESSED]
            return ready if len(ready) == len(txids) else []
        slot = self.slots.get(self.currtx)
        if slot is None or slot.state is not SlotState.PROCESSED:
            return []
        members = [slot]
        while slot.groupable and len(members) < self.settings.max_group:
            after = self.slots.get(slot.txid + 1)
            if after is None or after.state is not SlotState.PROCESSED or not after.groupable:
                break
            members.append(after)
            slot = after
        after = self.slots.get(slot.txid + 1)
        grows = slot.groupable and len(members) < self.settings.max_group
        if grows and after is not None and after.state in _PROCESSING:
            head = members[0]
            if (
                head.processed_at is not None
                and now < head.processed_at + self.settings.group_wait_s
            ):
                return []
        return members

    def _committing(self) -> list[Slot]:
        """The slots of the first commit running (from ``currtx``), in txid order."""
        first, last = self.commits[0]
        return [self.slots[t] for t in range(first, last + 1)]

    def _in_pinned_group(self, txid: int) -> bool:
        """Whether ``txid`` is in a pinned group of two or more (one that may have
        reached a sink as a whole, so it is committed whole even if a replay is empty)."""
        pinned = self.pinned
        return pinned is not None and pinned[0] < pinned[1] and pinned[0] <= txid <= pinned[1]
