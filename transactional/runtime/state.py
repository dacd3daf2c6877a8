"""The state machine's records: its in-flight slots and its counts. (Its settings are
the runner's own ``RunnerConfig``.)"""

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
    #: at_most_once: failed and dropped, never retried; the store moves past it (Skip)
    #: when it is ``currtx``.
    DROPPED = "dropped"


@dataclass
class Slot:
    """One in-flight txid and its current attempt."""

    attempt: TransactionAttempt
    number: int
    deadline: float | None
    state: SlotState = SlotState.PROCESSING
    records: int = 0
    empty: bool = False  # processed without records: retracted once verified
    groupable: bool = False  # may be committed in a group with its neighbours
    processed_at: float | None = None
    queued_s: float = 0.0
    #: ``records`` is known: the attempt was processed.
    counted: bool = False
    #: Dropped after its commit reached every sink (the store's advance failed).
    in_sink: bool = False
    #: Dropped while its commit still runs (past its deadline): the store does not move
    #: past it before the commit's outcome is known.
    awaiting_commit: bool = False

    @property
    def txid(self) -> int:
        return self.attempt.txid


@dataclass
class Counts:
    """What the machine counted (``RunStats`` shows them)."""

    committed_txids: int = 0
    #: Commits of two or more txids as one sink write (``max_group``).
    grouped_commits: int = 0
    records: int = 0
    failures: int = 0
    stale_ignored: int = 0
    #: Batches found empty and not committed (their txids retracted): idle polls.
    empty_polls: int = 0
    #: Times leadership was lost and taken back during the run (step 7).
    reelections: int = 0
    last_committed: int = 0
    #: at_most_once: txids dropped (failed, never retried), and the records of those
    #: that were counted before they failed.
    dropped_txids: int = 0
    dropped_records: int = 0


class InvariantError(AssertionError):
    """A protocol invariant does not hold: a bug in the machine, never a user error."""
