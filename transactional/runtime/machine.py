"""The transaction state machine, as pure code: ``Machine.step(event, now)`` takes one
typed event and the time and returns the typed commands to carry out, in order. It
holds the protocol's whole decision state (the txids in flight and their state,
``currtx``, failures, back-off and poll deadlines) and nothing else: no Spark, threads,
I/O or spout; the executor (``runtime/executor.py``) carries its commands out.

What it decides, its turn and the invariants it asserts after every step:
docs/architecture.md, "The protocol"; commit groups, overlapping commits and the three
guarantees have sections of their own there.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transactional.config import RunnerConfig
from transactional.errors import (
    AttemptTimeoutError,
    ConfigurationError,
    FencedError,
    LostLeadershipError,
)
from transactional.runtime.invariants import check_invariants
from transactional.runtime.messages import (
    Acknowledge,
    Advance,
    Advanced,
    Backoff,
    Cancel,
    Command,
    Commit,
    CommitBegan,
    Committed,
    Drop,
    Emit,
    Event,
    Failed,
    Halt,
    HaltReason,
    LeadershipLost,
    NotReady,
    Opened,
    Phase,
    Processed,
    Reacquire,
    Replay,
    Retract,
    Retracted,
    Skip,
    Skipped,
    Started,
    StopRequested,
    Tick,
    Verified,
    Verify,
)
from transactional.runtime.state import Counts, InvariantError, Slot, SlotState
from transactional.types import Guarantee, TransactionAttempt

#: The states of a txid still being processed: a commit group may wait for it.
_PROCESSING = (SlotState.PROCESSING, SlotState.VERIFYING)


@dataclass
class Machine:
    #: The runner's configuration; the machine reads its limits, timeouts and back-off.
    settings: RunnerConfig
    currtx: int = 1
    next_txid: int = 1
    #: Txids whose metadata is in the store (at or above ``currtx``): replayed, never
    #: decided again.
    stored: set[int] = field(default_factory=set)
    slots: dict[int, Slot] = field(default_factory=dict)
    counts: Counts = field(default_factory=Counts)
    failures: Counter[int] = field(default_factory=Counter)
    #: Attempts of each uncommitted txid in this run, counting those dropped because a
    #: lower txid failed: fault plans and logs number attempts by it.
    attempts: Counter[int] = field(default_factory=Counter)
    retry_at: float = 0.0
    poll_at: float = 0.0
    poll_interval: float = 0.0
    not_ready: bool = False
    #: The source held more than the last txid started took (``Started.backlog``): the
    #: next may be decided while txids process. Caught up, it is decided once none
    #: processes, so that it holds what came meanwhile and processes while the one
    #: before commits, instead of splitting the same records into small txids that
    #: compete for the cores (measured: more in flight then made records wait longer).
    backlog: bool = True
    stopping: bool = False
    #: The txid whose start was asked for and not yet answered.
    starting: int | None = None
    #: The commits sent and not yet advanced past, ``(first, last)`` each, in txid
    #: order: the first from ``currtx``, each from the txid after the one before. Their
    #: txids are ``COMMITTING``, then ``ADVANCING`` once the commit is done.
    commits: list[tuple[int, int]] = field(default_factory=list)
    #: ``(first, last)``: the txids the next commit from ``currtx`` must be, exactly (see
    #: the module); while one runs, the first running's own.
    pinned: tuple[int, int] | None = None
    #: How many commits may run at once (see the module): 1, except under
    #: ``at_least_once`` with committers whose commits may overlap.
    overlap: int = 1
    opened: bool = False
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.poll_interval = self.settings.poll_interval_s
        if self.overlap > 1 and self.settings.guarantee is not Guarantee.AT_LEAST_ONCE:
            raise InvariantError(f"overlapping commits under {self.settings.guarantee}")

    @property
    def committing(self) -> int | None:
        """The first txid of the first commit running (``currtx``), if one runs."""
        return self.commits[0][0] if self.commits else None

    # ------------------------------------------------------------------ the one entry

    def step(self, event: Event, now: float) -> list[Command]:
        """Handle ``event`` at time ``now``; the commands to carry out, in order."""
        out: list[Command] = []
        if self.starting is not None and not _answers(event, self.starting):
            raise InvariantError(f"{event} while the start of txid {self.starting} is unanswered")
        handler = _HANDLERS[type(event)]
        handler(self, event, now, out)
        # A command answered at once (by the executor, on this thread) continues the turn
        # when its answer comes: nothing may start while it is unanswered.
        if self.opened and not any(isinstance(c, _ANSWERED_AT_ONCE) for c in out):
            self._turn(now, out)
        check_invariants(self)
        return out

    # ------------------------------------------------------------------ queries

    def drained(self, now: float) -> bool:
        """Nothing new, nothing in flight, nothing to retry: ``until_drained`` may end."""
        return (
            self.not_ready
            and not self.slots
            and self.starting is None
            and self.next_txid == self.currtx
            and now >= self.retry_at
        )

    def in_flight(self) -> list[TransactionAttempt]:
        """The current attempt of each txid in flight, in txid order."""
        return [self.slots[t].attempt for t in sorted(self.slots)]

    def running_commits(self) -> list[int]:
        """The first txid of each commit sent and not yet advanced past, in txid order."""
        return [first for first, _ in self.commits]

    def is_current(self, attempt: TransactionAttempt) -> bool:
        """Whether ``attempt`` is the current attempt of an in-flight txid."""
        slot = self.slots.get(attempt.txid)
        return slot is not None and slot.attempt == attempt

    def wait_time(self, now: float) -> float:
        """How long the executor may wait for an event before the next ``Tick``."""
        deadlines = [s.deadline for s in self.slots.values() if s.deadline is not None]
        if self.retry_at > now:
            deadlines.append(self.retry_at)
        if self.not_ready or self.poll_at > now:
            deadlines.append(self.poll_at)
        if not self.not_ready and self._may_start(now):
            deadlines.append(now)
        head = self.slots.get(self.currtx)
        if head is not None and head.processed_at is not None and not self.commits:
            # Once past, the tick at it has committed what it could: a pinned group
            # waiting for a txid to be retried waits for the retry, not in 1 ms ticks.
            grouped_by = head.processed_at + self.settings.group_wait_s
            if grouped_by > now:
                deadlines.append(grouped_by)
        wait = min(deadlines, default=now + 1.0) - now
        return max(0.001, min(wait, 1.0))

    # ------------------------------------------------------------------ handlers

    def _opened(self, event: Opened, now: float, out: list[Command]) -> None:
        self.currtx = self.next_txid = event.currtx
        self.stored = {t for t in event.stored if t >= event.currtx}
        group = event.group
        recorded = group is not None and group[0] == event.currtx
        self.pinned = group if recorded else (event.currtx, event.currtx)
        self.retry_at = self.poll_at = 0.0
        self.not_ready = False
        self.starting = None
        self.opened = True
        self.counts.dropped_txids += len(event.dropped)

    def _tick(self, event: Tick, now: float, out: list[Command]) -> None:
        pass  # the turn that follows every event does the work

    def _stop(self, event: StopRequested, now: float, out: list[Command]) -> None:
        self.stopping = True

    def _started(self, event: Started, now: float, out: list[Command]) -> None:
        attempt = event.attempt
        if self.starting != attempt.txid:
            raise InvariantError(f"started {attempt} while starting {self.starting}")
        self.starting = None
        deadline = None
        if self.settings.attempt_timeout_s is not None:
            deadline = now + self.settings.attempt_timeout_s
        self.slots[attempt.txid] = Slot(attempt, self.attempts[attempt.txid], deadline)
        self.stored.add(attempt.txid)
        self.not_ready = False
        self.backlog = event.backlog
        self.next_txid += 1

    def _not_ready(self, event: NotReady, now: float, out: list[Command]) -> None:
        if self.starting != event.txid:
            raise InvariantError(f"not ready {event.txid} while starting {self.starting}")
        self.starting = None
        self.attempts[event.txid] -= 1  # no attempt was made
        self._idle_poll(now)

    def _processed(self, event: Processed, now: float, out: list[Command]) -> None:
        slot = self._current(event.attempt, SlotState.PROCESSING)
        if slot is None:
            return
        slot.records, slot.empty = event.records, event.empty
        slot.counted = True
        slot.groupable = event.groupable
        slot.state = SlotState.VERIFYING
        out.append(Verify(event.attempt))

    def _verified(self, event: Verified, now: float, out: list[Command]) -> None:
        slot = self._current(event.attempt, SlotState.VERIFYING)
        if slot is None:
            return
        if (
            slot.empty
            and not self._in_pinned_group(slot.txid)
            and not self._dropped_above(slot.txid)
        ):
            out.append(Retract(slot.attempt))
            return
        self.poll_interval = self.settings.poll_interval_s  # data flows: the base rate
        slot.state = SlotState.PROCESSED
        slot.processed_at = now
        slot.deadline = None

    def _retracted(self, event: Retracted, now: float, out: list[Command]) -> None:
        slot = self._current(event.attempt, SlotState.VERIFYING)
        if slot is None:
            return
        txid = slot.txid
        self._drop_from(txid, out, failed=False)
        for gone in [t for t in self.attempts if t >= txid]:
            del self.attempts[gone]
        self.stored = {t for t in self.stored if t < txid}
        self.next_txid = txid
        self.counts.empty_polls += 1
        self._idle_poll(now)

    def _commit_began(self, event: CommitBegan, now: float, out: list[Command]) -> None:
        slot = self._current(event.attempt, SlotState.COMMITTING)
        if slot is not None and self.settings.attempt_timeout_s is not None:
            slot.deadline = now + self.settings.attempt_timeout_s

    def _committed(self, event: Committed, now: float, out: list[Command]) -> None:
        dropped = self.slots.get(event.attempt.txid)
        if dropped is not None and dropped.attempt == event.attempt and dropped.awaiting_commit:
            for member in self._awaiting_commit():  # dropped past its deadline, and held
                member.awaiting_commit, member.in_sink = False, True
            return
        slot = self._current(event.attempt, SlotState.COMMITTING)
        if slot is None:
            return
        last = next(b for a, b in self.commits if a == slot.txid)
        for txid in range(slot.txid, last + 1):
            member = self.slots[txid]
            member.state = SlotState.ADVANCING
            member.deadline = None
        self._advance_first(out)

    def _advance_first(self, out: list[Command]) -> None:
        """Move the store past the first commit running once it is done (one that finished
        before it waits for it)."""
        if self.commits:
            members = self._committing()
            if all(m.state is SlotState.ADVANCING for m in members):
                out.append(Advance(members[0].attempt, members[-1].txid))

    def _advanced(self, event: Advanced, now: float, out: list[Command]) -> None:
        slot = self._current(event.attempt, SlotState.ADVANCING)
        if slot is None:
            raise InvariantError(f"advanced {event.attempt}, which was not advancing")
        if slot.txid != self.currtx or self.committing != slot.txid:
            raise InvariantError(f"advanced txid {slot.txid} with currtx={self.currtx}")
        members = self._committing()
        last = members[-1].txid
        for member in members:
            txid = member.txid
            del self.slots[txid]
            self.failures.pop(txid, None)
            self.attempts.pop(txid, None)
            self.counts.records += member.records
            out.append(Acknowledge(member.attempt, member.number, member.records, member.queued_s))
        self.commits.pop(0)
        self.pinned = self.commits[0] if self.commits else None
        self.currtx = last + 1
        self.stored = {t for t in self.stored if t > last}
        self.counts.committed_txids += len(members)
        self.counts.grouped_commits += len(members) > 1
        self.counts.last_committed = last
        self._advance_first(out)  # a commit after it that finished first

    def _skipped(self, event: Skipped, now: float, out: list[Command]) -> None:
        slot = self._current(event.attempt, SlotState.DROPPED)
        if slot is None or slot.txid != self.currtx or self.commits:
            raise InvariantError(f"skipped {event.attempt} with currtx={self.currtx}")
        txid = slot.txid
        del self.slots[txid]
        self.failures.pop(txid, None)
        self.attempts.pop(txid, None)
        self.currtx = txid + 1
        self.pinned = None
        self.stored = {t for t in self.stored if t > txid}
        if slot.in_sink:  # committed; only the store's advance had failed
            self.counts.committed_txids += 1
            self.counts.records += slot.records
            self.counts.last_committed = txid
        else:
            self.counts.dropped_txids += 1
            self.counts.dropped_records += slot.records if slot.counted else 0

    def _failed(self, event: Failed, now: float, out: list[Command]) -> None:
        attempt = event.attempt
        if event.phase is Phase.START:
            if self.starting != attempt.txid:
                raise InvariantError(f"start of {attempt} failed while starting {self.starting}")
            self.starting = None
            if event.stored:
                self.stored.add(attempt.txid)
                if self._keeps_failed_start(event):
                    # at_most_once: the batch is decided and stored, so it is consumed
                    # whatever happens next: a slot of its own, dropped in ``_fail``.
                    self.slots[attempt.txid] = Slot(attempt, self.attempts[attempt.txid], None)
                    self.next_txid = attempt.txid + 1
        elif self._current(attempt, None) is None:
            return
        if isinstance(event.error, LostLeadershipError):  # step 7, not a failure of the txid
            self._leadership_lost(LeadershipLost(event.error), now, out)
            return
        self._fail(attempt.txid, event.error, event.phase, now, out)

    def _keeps_failed_start(self, event: Failed) -> bool:
        return self.settings.guarantee is Guarantee.AT_MOST_ONCE and not isinstance(
            event.error, LostLeadershipError | ConfigurationError
        )

    def _leadership_lost(self, event: LeadershipLost, now: float, out: list[Command]) -> None:
        self._drop_from(min(self.slots, default=self.currtx), out, failed=True)
        self.starting = None
        self.opened = False
        if isinstance(event.error, FencedError):
            out.append(Halt(HaltReason.DEPOSED, event.error))
            return
        self.counts.reelections += 1
        if self.counts.reelections > self.settings.max_reelections:
            out.append(Halt(HaltReason.REELECTIONS, event.error))
            return
        out.append(Reacquire(event.error))

    # ------------------------------------------------------------------ the turn

    def _turn(self, now: float, out: list[Command]) -> None:
        if self._start_next(now, out):
            return  # one start at a time: its answer continues the turn
        if self._maybe_skip(now, out):
            return  # answered at once, as a start is
        self._maybe_commit(now, out)
        self._check_timeouts(now, out)

    def _room(self) -> bool:
        return self.next_txid < self.currtx + self.window()

    def _may_start(self, now: float) -> bool:
        """The next txid may start now: none is starting, the run is not stopping, no
        retry is pending, the window has room, and the txid is stored (a replay) or a
        new one may be decided (its poll is due and ``_may_decide``)."""
        if self.starting is not None or self.stopping or now < self.retry_at:
            return False
        if not self._room():
            return False
        return self.next_txid in self.stored or (now >= self.poll_at and self._may_decide())

    def _start_next(self, now: float, out: list[Command]) -> bool:
        if not self._may_start(now):
            return False
        txid = self.next_txid
        replay = txid in self.stored
        self.attempts[txid] += 1
        attempt = TransactionAttempt(txid, next(self._ids))
        self.starting = txid
        number = self.attempts[txid]
        out.append(Replay(attempt, number) if replay else Emit(attempt, number))
        return True

    def _maybe_skip(self, now: float, out: list[Command]) -> bool:
        """``at_most_once``: move the store past ``currtx`` if it was dropped (and its
        commit, if one ran past its deadline, has an outcome). Also while stopping: a
        dropped txid is never to be emitted again, by this run or the next."""
        head = self.slots.get(self.currtx)
        if self.commits or head is None or head.state is not SlotState.DROPPED:
            return False
        if head.awaiting_commit or now < self.retry_at:
            return False
        out.append(
            Skip(head.attempt, head.number, head.records if head.counted else None, head.in_sink)
        )
        return True

    def _maybe_commit(self, now: float, out: list[Command]) -> None:
        while len(self.commits) < self.overlap and not self.stopping:  # a stop starts none
            members = self._next_group(now)
            if not members:
                return
            for slot in members:
                slot.state = SlotState.COMMITTING
                if slot.processed_at is not None:
                    slot.queued_s = now - slot.processed_at
                slot.deadline = None  # starts when the commit thread takes it up (CommitBegan)
            first, last = members[0], members[-1]
            if not self.commits:
                self.pinned = (first.txid, last.txid)
            self.commits.append((first.txid, last.txid))
            more = tuple((s.attempt, s.number) for s in members[1:])
            out.append(Commit(first.attempt, first.number, more))

    # ------------------------------------------------------------------ helpers

    def _current(self, attempt: TransactionAttempt, state: SlotState | None) -> Slot | None:
        """The slot ``attempt`` is the current attempt of (in ``state``), else None:
        the event is stale (a superseded or dropped attempt) and is ignored."""
        slot = self.slots.get(attempt.txid)
        if slot is None or slot.attempt != attempt or (state is not None and slot.state != state):
            self.counts.stale_ignored += 1
            return None
        return slot

    def _dropped_above(self, txid: int) -> bool:
        """``at_most_once``: a txid above ``txid`` was dropped, so its batch is consumed:
        an empty ``txid`` is then committed (empty), not retracted, since a retraction
        forgets every txid above it and would decide the dropped batch again."""
        return any(t > txid and s.state is SlotState.DROPPED for t, s in self.slots.items())

    def _may_decide(self) -> bool:
        """A new txid may be decided now: the source is ahead (``backlog``), or no txid
        is being processed."""
        return self.backlog or not any(s.state in _PROCESSING for s in self.slots.values())

    def _idle_poll(self, now: float) -> None:
        """Nothing new: ask again after the poll interval. With nothing in flight the
        source is idle, and the interval doubles with every such poll in a row up to
        ``poll_max_s`` (a batch with records resets it); with txids in flight it is
        busy and only caught up for a moment, so the base interval, never backed off."""
        self.not_ready = True
        if self.slots:
            self.poll_at = now + self.settings.poll_interval_s
            return
        self.poll_at = now + self.poll_interval
        self.poll_interval = min(self.settings.poll_max_s, self.poll_interval * 2)

    # Commit groups: which txids are committed together, the pinned group, and the
    # window it widens.

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

    # Failures: count one, drop the failed txid and every txid above it and back off,
    # or halt when retrying cannot help (docs/architecture.md, The protocol, step 5); under
    # at_most_once, drop the failed txid alone, for good. The attempt deadlines fail
    # here too.

    def _check_timeouts(self, now: float, out: list[Command]) -> None:
        """Fail the lowest txid whose attempt is past its deadline (one a turn: failing
        it drops every txid above it)."""
        for slot in sorted(self.slots.values(), key=lambda s: s.txid):
            if slot.deadline is not None and now >= slot.deadline:
                committing = slot.state is SlotState.COMMITTING
                phase = Phase.COMMIT if committing else Phase.PROCESS
                error = AttemptTimeoutError(
                    f"txid {slot.txid} attempt {slot.attempt.attempt_id} exceeded "
                    f"{self.settings.attempt_timeout_s}s in {phase}; its Spark jobs were "
                    "cancelled"
                )
                self._fail(slot.txid, error, phase, now, out)
                return

    def _fail(
        self, txid: int, error: Exception, phase: Phase, now: float, out: list[Command]
    ) -> None:
        """``txid`` failed in ``phase``: drop it and every txid above it, then back off
        before retrying it, or halt on a configuration error or its ``max_attempts``-th
        failure. Under ``at_most_once``, drop it for good instead (see the module)."""
        if self._drops_for_good(txid, error, phase):
            self._drop_for_good(txid, error, phase, now, out)
            return
        self.counts.failures += 1
        self._drop_from(txid, out, failed=True)
        self.next_txid = min(self.next_txid, txid)
        self.not_ready = False
        self._retry_or_halt(txid, error, phase, now, out)

    def _retry_or_halt(
        self, txid: int, error: Exception, phase: Phase, now: float, out: list[Command]
    ) -> None:
        """Count a failure of ``txid`` and retry it after a back-off, or halt when
        retrying cannot help: a configuration error (the same on every attempt), or the
        txid's ``max_attempts``-th failure."""
        self.failures[txid] += 1
        failures = self.failures[txid]
        if isinstance(error, ConfigurationError):
            out.append(Halt(HaltReason.CONFIGURATION, error, txid, phase, failures))
        elif failures >= self.settings.max_attempts:
            out.append(Halt(HaltReason.POISON, error, txid, phase, failures))
        else:
            self.retry_at = now + self.settings.backoff(failures)
            out.append(Backoff(txid, error, phase, failures, self.retry_at))

    def _drop_from(self, txid: int, out: list[Command], failed: bool) -> None:
        """Drop ``txid`` and every in-flight txid above it (step 5; step 7 drops all),
        with the commits of them (a commit's thread still running is not waited for)."""
        self.commits = [(a, b) for a, b in self.commits if b < txid]
        for t in sorted(t for t in self.slots if t >= txid):
            slot = self.slots.pop(t)
            out.append(Cancel(slot.attempt, failed))

    def _drops_for_good(self, txid: int, error: Exception, phase: Phase) -> bool:
        """Whether ``txid``'s failure drops it for good: ``at_most_once``, a txid in
        flight (its metadata stored), not an empty batch's retraction (nothing of it
        can count twice) nor a configuration error (the same on every txid)."""
        return (
            self.settings.guarantee is Guarantee.AT_MOST_ONCE
            and txid in self.slots
            and phase is not Phase.RETRACT
            and not isinstance(error, ConfigurationError)
        )

    def _drop_for_good(
        self, txid: int, error: Exception, phase: Phase, now: float, out: list[Command]
    ) -> None:
        """``at_most_once``: ``txid`` (with its commit group, when the group's commit
        failed) is dropped and reported; the txids above it go on. A commit dropped past
        its deadline still runs: the store waits for its outcome (``awaiting_commit``),
        which says whether the sinks hold it (``Machine._committed``) or it is lost. A
        store that fails to move past a dropped txid (``Skip``) is tried again after a
        back-off, as a failed advance is, up to ``max_attempts``."""
        slot = self.slots[txid]
        if slot.state is SlotState.DROPPED and phase is Phase.ADVANCE:  # the Skip failed
            self._retry_or_halt(txid, error, phase, now, out)
            return
        if slot.state is SlotState.DROPPED:  # a commit dropped past its deadline failed
            for member in self._awaiting_commit():
                member.awaiting_commit = False
                out.append(Drop(member.attempt, member.number, error, phase))
            return
        self.counts.failures += 1
        members = [slot]
        if self.commits and self.commits[0][0] == txid:  # never more than one here
            members = self._committing()
            self.commits, self.pinned = [], None
        for member in members:
            member.awaiting_commit = (
                member.state is SlotState.COMMITTING and phase is not Phase.COMMIT
            )
            member.in_sink = member.state is SlotState.ADVANCING
            member.state = SlotState.DROPPED
            member.deadline = None
            lost = not (member.in_sink or member.awaiting_commit)
            out.append(Cancel(member.attempt, failed=lost))
            if lost:
                out.append(Drop(member.attempt, member.number, error, phase))

    def _awaiting_commit(self) -> list[Slot]:
        """The dropped txids whose commit still runs (one commit, or group, at a time)."""
        return sorted((s for s in self.slots.values() if s.awaiting_commit), key=lambda s: s.txid)


#: Commands whose outcome is the next event the machine hears (or that end the run).
_ANSWERED_AT_ONCE = (Verify, Advance, Retract, Skip, Reacquire, Halt)


def _answers(event: Event, txid: int) -> bool:
    """Whether ``event`` answers the pending start of ``txid``: a start is answered
    before anything else reaches the machine (the executor starts synchronously)."""
    if isinstance(event, Started | Failed):
        return event.attempt.txid == txid
    return isinstance(event, NotReady) and event.txid == txid


_Handler = Callable[[Machine, Any, float, list[Command]], None]
_HANDLERS: dict[type, _Handler] = {
    Opened: Machine._opened,
    Tick: Machine._tick,
    StopRequested: Machine._stop,
    Started: Machine._started,
    NotReady: Machine._not_ready,
    Processed: Machine._processed,
    Verified: Machine._verified,
    Retracted: Machine._retracted,
    CommitBegan: Machine._commit_began,
    Committed: Machine._committed,
    Advanced: Machine._advanced,
    Skipped: Machine._skipped,
    Failed: Machine._failed,
    LeadershipLost: Machine._leadership_lost,
}
