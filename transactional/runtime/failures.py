"""What a failure does to the state machine, kept apart from its handlers: count it,
drop the failed txid and every txid above it, and back off, or halt the run when
retrying cannot help (DESIGN.md section 4, step 5). The attempt deadlines fail here too.

See ``transactional.runtime.machine`` for where each failure comes from.
"""

from __future__ import annotations

from collections import Counter

from transactional.config import RunnerConfig
from transactional.errors import AttemptTimeoutError, ConfigurationError
from transactional.runtime.messages import Backoff, Cancel, Command, Halt, HaltReason, Phase
from transactional.runtime.state import Counts, Slot, SlotState


class FailureRules:
    """The machine's failure decisions (a mixin of ``Machine``, over its state)."""

    settings: RunnerConfig
    slots: dict[int, Slot]
    counts: Counts
    failures: Counter[int]
    next_txid: int
    retry_at: float
    not_ready: bool
    committing: int | None

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
        failure."""
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
        """Drop ``txid`` and every in-flight txid above it (step 5; step 7 drops all)."""
        for t in sorted(t for t in self.slots if t >= txid):
            slot = self.slots.pop(t)
            if self.committing == t:
                self.committing = None
            out.append(Cancel(slot.attempt, failed))
