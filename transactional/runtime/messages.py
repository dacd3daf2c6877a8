"""What the state machine hears and says: typed events in, typed commands out.

Events report what happened (from the executor: a start answered, a worker's result, a
commit done; or time passing); commands say what to do next. Both are immutable values,
so a schedule of events is a readable test case (``tests/unit/test_machine*.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum

from transactional.errors import LostLeadershipError
from transactional.types import TransactionAttempt


class Phase(StrEnum):
    """The protocol step a failure happened in (named in logs and errors)."""

    START = "start"
    PROCESS = "process"
    COMMIT = "commit"
    ADVANCE = "advance"
    RETRACT = "retract"


@dataclass(frozen=True)
class OfAttempt:
    """A message about one attempt (the base of the messages that carry nothing else)."""

    attempt: TransactionAttempt


@dataclass(frozen=True)
class OfNumberedAttempt:
    """A message about one attempt and its number: the how-manyth attempt of its txid
    in this run, 1-based (fault plans and logs count by it)."""

    attempt: TransactionAttempt
    number: int


# ---------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Opened:
    """Leadership is held and the stored state read (at start, or taken back after a
    loss): ``currtx`` and the txids with stored metadata, which are replayed first."""

    currtx: int
    stored: frozenset[int]
    #: The commit group the store recorded (``StateStore.record_group``), if any.
    group: tuple[int, int] | None = None
    #: ``at_most_once``: the txids found stored and uncommitted, which the store was moved
    #: past (``runtime.settle``) instead of being replayed, and the sinks did not hold.
    dropped: tuple[int, ...] = ()


@dataclass(frozen=True)
class Tick:
    """Time passed (a wait ended): deadlines may be due."""


@dataclass(frozen=True)
class StopRequested:
    """Start nothing more (Ctrl-C, SIGTERM, ``runner.stop()``)."""


@dataclass(frozen=True)
class Started(OfAttempt):
    """The attempt of an ``Emit`` or ``Replay`` is out: its metadata is stored (a new
    txid) and a worker processes it. ``backlog``: the source held more than the txid
    took (``Spout.lag`` above 0 after the decision) or its lag is unknown (``lag`` gave
    None), so the next txid may be decided while this one processes."""

    backlog: bool = True


@dataclass(frozen=True)
class NotReady:
    """The spout has nothing new for ``txid`` (``is_ready`` said no, or it decided the
    batch that was last found empty): nothing was stored."""

    txid: int


@dataclass(frozen=True)
class Processed:
    """A worker finished the attempt: ``records`` read; ``empty``: not to be committed
    (unless it belongs to a recorded commit group); ``groupable``: every committer may
    commit it in a group (``Committer.groupable``)."""

    attempt: TransactionAttempt
    records: int
    empty: bool
    groupable: bool = False


class Verified(OfAttempt):
    """The attempt's batch matched its first emit (or was its first emit, now recorded)."""


class Retracted(OfAttempt):
    """The empty batch's txid, and every one above it, is forgotten by the store."""


class CommitBegan(OfAttempt):
    """The commit thread took the attempt up: its commit timeout starts now."""


class Committed(OfAttempt):
    """Every committer committed the attempt's txid."""


class Advanced(OfAttempt):
    """The store's ``currtx`` moved past the attempt's txid."""


class Skipped(OfAttempt):
    """``at_most_once``: the store's ``currtx`` moved past the dropped attempt's txid."""


@dataclass(frozen=True)
class Failed:
    """The attempt failed in ``phase`` with ``error`` (an ``Exception``)."""

    attempt: TransactionAttempt
    error: Exception
    phase: Phase
    #: A start that failed after its metadata was stored: the txid is a replay now.
    stored: bool = False


@dataclass(frozen=True)
class LeadershipLost:
    """The store or a sink says this runner may no longer lead."""

    error: LostLeadershipError


Event = (
    Opened
    | Tick
    | StopRequested
    | Started
    | NotReady
    | Processed
    | Verified
    | Retracted
    | CommitBegan
    | Committed
    | Advanced
    | Skipped
    | Failed
    | LeadershipLost
)

# -------------------------------------------------------------------------- commands


class Emit(OfNumberedAttempt):
    """Start a new txid: ask the spout (``is_ready``, decide), store the metadata, emit."""


class Replay(OfNumberedAttempt):
    """Start a txid again from its stored metadata."""


class Verify(OfAttempt):
    """Check the processed batch against its first emit (determinism), recording it if
    this was the first."""


@dataclass(frozen=True)
class Commit:
    """Commit the txid through every committer, in order, after a leadership check;
    with ``more`` (the attempts of the txids after it, and their numbers), all of them
    as one commit group: recorded in the store first, then one write per committer."""

    attempt: TransactionAttempt
    number: int
    more: tuple[tuple[TransactionAttempt, int], ...] = ()

    @property
    def members(self) -> tuple[tuple[TransactionAttempt, int], ...]:
        return ((self.attempt, self.number), *self.more)


@dataclass(frozen=True)
class Advance:
    """Fenced store write: ``currtx = through + 1`` (``through``: the last txid of the
    commit group ``attempt`` starts, or its own)."""

    attempt: TransactionAttempt
    through: int


@dataclass(frozen=True)
class Acknowledge:
    """The txid is committed and the store advanced: run the spout's hooks and tell the
    observers. ``queued_s``: how long it sat processed behind earlier commits."""

    attempt: TransactionAttempt
    number: int
    records: int
    queued_s: float


class Retract(OfAttempt):
    """Forget the empty batch's txid and every one above it in the store."""


@dataclass(frozen=True)
class Cancel:
    """Drop an in-flight attempt: cancel its Spark jobs; ``failed``: tell the spout."""

    attempt: TransactionAttempt
    failed: bool


@dataclass(frozen=True)
class Backoff:
    """A txid failed (``failures`` times now); it starts again at ``retry_at``."""

    txid: int
    error: Exception
    phase: Phase
    failures: int
    retry_at: float


@dataclass(frozen=True)
class Drop:
    """``at_most_once``: the attempt failed in ``phase`` with ``error`` and is dropped,
    never retried (its jobs are cancelled by the ``Cancel`` before this): report it,
    with its batch's metadata. The store moves past it in its turn (``Skip``)."""

    attempt: TransactionAttempt
    number: int
    error: Exception
    phase: Phase


@dataclass(frozen=True)
class Skip:
    """``at_most_once``: fenced store write, ``currtx = txid + 1``, with no commit: the
    txid was dropped (``records``: its records, None if it failed before they were
    counted), or ``in_sink``: its commit reached every sink and only the store's advance
    failed. Then the spout's ``cleanup_before`` and ``ack``: it is never emitted again."""

    attempt: TransactionAttempt
    number: int
    records: int | None
    in_sink: bool = False


@dataclass(frozen=True)
class Reacquire:
    """Take the leadership back on the same store, then report ``Opened``."""

    error: LostLeadershipError


class HaltReason(Enum):
    CONFIGURATION = "configuration"  # the same on every attempt: never retried
    POISON = "poison"  # failed max_attempts times
    DEPOSED = "deposed"  # another runner leads
    REELECTIONS = "reelections"  # lost the leadership too often


@dataclass(frozen=True)
class Halt:
    """Stop the run with an error: ``txid``/``phase``/``failures`` say where, when it
    was a txid's failure."""

    reason: HaltReason
    error: BaseException
    txid: int | None = None
    phase: Phase | None = None
    failures: int = 0


Command = (
    Emit
    | Replay
    | Verify
    | Commit
    | Advance
    | Acknowledge
    | Retract
    | Cancel
    | Backoff
    | Drop
    | Skip
    | Reacquire
    | Halt
)
