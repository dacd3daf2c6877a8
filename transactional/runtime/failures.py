"""What a failure does to the state machine, kept apart from its handlers: count it,
drop the failed txid and every txid above it, and back off, or halt the run when
retrying cannot help (DESIGN.md section 4, step 5). The attempt deadlines fail here too.

Under ``at_most_once`` a failed txid is not retried: it alone (its commit group, if it
failed committing) is dropped for good (``SlotState.DROPPED``, reported by ``Drop``),
the txids above it go on, and the store moves past it in its turn (``Skip``). A start
that failed before its metadata was stored consumed nothing, and is retried as under the
other guarantees; a configuration error halts as always.

See ``transactional.runtime.machine`` for where each failure comes from.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from transactional.config import RunnerConfig
from transactional.errors import AttemptTimeoutError, ConfigurationError
from transactional.runtime.messages import (
    Backoff,
    Cancel,
    Command,
    Drop,
    Halt,
    HaltReason,
    Phase,
)
from transactional.runtime.state import Counts, Slot, SlotState
from transactional.types import Guarantee


class FailureRules:
    """The machine's failure decisions (a mixin of ``Machine``, over its state)."""

    settings: RunnerConfig
    slots: dict[int, Slot]
    counts: Counts
    failures: Counter[int]
    next_txid: int
    retry_at: float
    not_ready: bool
    commits: list[tuple[int, int]]
    pinned: tuple[int, int] | None

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
        self.failures[txid] += 1
        failures = self.failures[txid]
        self.counts.failures += 1
        self._drop_from(txid, out, failed=True)
        self.next_txid = min(self.next_txid, txid)
        self.not_ready = False
        if isinstance(error, ConfigurationError):  # the same on every attempt
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
            self.failures[txid] += 1
            failures = self.failures[txid]
            if failures >= self.settings.max_attempts:
                out.append(Halt(HaltReason.POISON, error, txid, phase, failures))
            else:
                self.retry_at = now + self.settings.backoff(failures)
                out.append(Backoff(txid, error, phase, failures, self.retry_at))
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

    if TYPE_CHECKING:

        def _committing(self) -> list[Slot]: ...  # ``CommitGroups``, beside it in ``Machine``
