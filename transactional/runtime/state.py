"""The state machine's records: its settings, its in-flight slots and its counts."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from transactional.types import TransactionAttempt


class SlotState(Enum):
    """Where an in-flight txid's current attempt is."""

    PROCESSING = "processing"  # emitted; bolts and prepare running in a worker
    VERIFYING = "verifying"  # processed; its batch checked against its first emit
    PROCESSED = "processed"  # waiting for its turn to commit
    COMMITTING = "committing"  # the commit thread has it
    ADVANCING = "advancing"  # committed in every sink; the store not yet advanced


@dataclass(frozen=True)
class Settings:
    """What the machine needs of ``RunnerConfig``."""

    max_pending: int = 2
    max_attempts: int = 10
    attempt_timeout_s: float | None = 300.0
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0
    poll_interval_s: float = 1.0
    poll_max_s: float = 30.0
    max_reelections: int = 10

    def backoff(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return float(min(self.backoff_max_s, self.backoff_initial_s * 2 ** (failures - 1)))


@dataclass
class Slot:
    """One in-flight txid and its current attempt."""

    attempt: TransactionAttempt
    number: int
    deadline: float | None
    state: SlotState = SlotState.PROCESSING
    records: int = 0
    empty: bool = False  # processed without records: retracted once verified
    processed_at: float | None = None
    queued_s: float = 0.0

    @property
    def txid(self) -> int:
        return self.attempt.txid


@dataclass
class Counts:
    """What the machine counted (``RunStats`` shows them)."""

    committed_txids: int = 0
    records: int = 0
    failures: int = 0
    stale_ignored: int = 0
    #: Batches found empty and not committed (their txids retracted): idle polls.
    empty_polls: int = 0
    #: Times leadership was lost and taken back during the run (step 7).
    reelections: int = 0
    last_committed: int = 0


class InvariantError(AssertionError):
    """A protocol invariant does not hold: a bug in the machine, never a user error."""
