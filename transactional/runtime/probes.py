"""What watches the protocol without being part of it: run statistics and timings, the
adaptive batch size, the run listener, logs and fault injection.

Each probe observes the machine's events and commands as the executor feeds and carries
them out (``on_event``, ``on_command``), and the times the executor measured
(``on_measure``); none decides anything the protocol does. Fault injection is the one
probe called *at* named points inside a step (``Faults.check``): a fault plan is how
tests make a step fail, so it must be reached from inside it.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from transactional.faults import FaultInjector, FaultPoint
from transactional.flow import HISTORY, AdaptiveBatchSize
from transactional.runtime import messages as m
from transactional.runtime.state import Counts
from transactional.types import CommitOutcome, TransactionAttempt

log = logging.getLogger("transactional.runner")


class RunListener(Protocol):
    """Hears each committed txid. A listener may also have ``on_drop(txid, records)``:
    under ``at_most_once``, a txid dropped (``records`` None when it failed before they
    were counted), called when the store moves past it."""

    def on_commit(self, txid: int, records: int) -> None: ...


@dataclass(frozen=True)
class TxTiming:
    """Seconds per protocol step of one committed txid: ``decide`` the spout's decision
    on the coordinator thread (a replay: its rebuild), ``store`` within it the store's
    write of its metadata, ``emit`` builds and materialises the batch (one Spark job
    reads, counts and keeps it), ``process`` runs the bolts (Spark plans them lazily:
    their work is done in the next step's job), ``prepare`` the committers' collecting
    jobs and their ``prepare``, ``verify`` the determinism check, ``queued`` the time
    it sat processed before its commit began, ``commit`` the committers, ``advance``
    the fenced store write. ``latency`` is what the adaptive batch size is fed: from
    its metadata stored to its commit done, through every attempt, less the time it sat
    processed, queued behind earlier commits. ``jobs``: the Spark jobs its last attempt
    ran (None: not known)."""

    txid: int
    store_s: float
    emit_s: float
    process_s: float
    commit_s: float
    advance_s: float
    latency_s: float | None = None
    prepare_s: float = 0.0
    jobs: int | None = None
    decide_s: float = 0.0
    verify_s: float = 0.0
    queued_s: float = 0.0


@dataclass
class RunStats(Counts):
    """What a run did: the machine's counts (committed txids, records, failures, stale
    reports ignored, empty polls, re-elections, the last committed txid) and what the
    probes saw."""

    outcomes: Counter[str] = field(default_factory=Counter)
    #: Commits that raised but that the sink held: resolved by reading it, not redone.
    resolved_commits: int = 0
    #: Where the latest committed txids' time went (their last, successful attempt).
    timings: deque[TxTiming] = field(default_factory=lambda: deque(maxlen=HISTORY))

    def count(self, counts: Counts) -> None:
        """Take the machine's counts (the executor calls this after every step)."""
        for name, value in vars(counts).items():
            setattr(self, name, value)


class Probe:
    """An observer; every hook does nothing unless overridden."""

    def on_event(self, event: m.Event, now: float) -> None:
        """The machine is about to be given ``event``."""

    def on_command(self, command: m.Command, now: float) -> None:
        """The executor is about to carry out ``command``."""

    def on_measure(self, attempt: TransactionAttempt, step: str, seconds: float) -> None:
        """``step`` of ``attempt`` took ``seconds``."""

    def on_jobs(self, attempt: TransactionAttempt, jobs: int | None) -> None:
        """``attempt``, committed, ran ``jobs`` Spark jobs (None: not known)."""

    def on_outcomes(self, attempt: TransactionAttempt, outcomes: Sequence[CommitOutcome]) -> None:
        """``attempt`` was committed; each committer, in the topology's order, did this."""


class Faults:
    """Fault injection at the named points of ``transactional.faults.FaultPoint``."""

    def __init__(self, plan: FaultInjector | None) -> None:
        self.plan = plan

    def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        if self.plan is not None:
            self.plan.check(point, attempt, number)


class Timings(Probe):
    """Each committed txid's ``TxTiming`` into ``RunStats.timings``, and its latency to
    the adaptive batch size, which also hears of every failure."""

    def __init__(self, stats: RunStats, batch_size: AdaptiveBatchSize | None) -> None:
        self.stats = stats
        self.batch_size = batch_size
        self._first_started: dict[int, float] = {}  # txid -> when its first attempt began
        self._steps: dict[int, dict[str, float]] = {}  # txid -> step -> seconds
        self._jobs: dict[int, int | None] = {}  # txid -> Spark jobs of its last attempt
        self._rounds: dict[int, int] = {}  # txid -> the adaptive size's round when it started

    def on_event(self, event: m.Event, now: float) -> None:
        if isinstance(event, m.Started):
            self._first_started.setdefault(event.attempt.txid, now)
            if self.batch_size is not None:  # it was decided in this round just before
                self._rounds.setdefault(event.attempt.txid, self.batch_size.round)
        elif isinstance(event, m.Retracted):
            self._first_started.pop(event.attempt.txid, None)
            self._rounds.pop(event.attempt.txid, None)
            self._steps.pop(event.attempt.txid, None)
            self._jobs.pop(event.attempt.txid, None)

    def on_measure(self, attempt: TransactionAttempt, step: str, seconds: float) -> None:
        self._steps.setdefault(attempt.txid, {})[step] = seconds

    def on_jobs(self, attempt: TransactionAttempt, jobs: int | None) -> None:
        self._jobs[attempt.txid] = jobs

    def on_command(self, command: m.Command, now: float) -> None:
        if isinstance(command, m.Backoff) and self.batch_size is not None:
            self.batch_size.on_failure()
        if not isinstance(command, m.Acknowledge):
            return
        txid = command.attempt.txid
        steps = self._steps.pop(txid, {})
        started = self._first_started.pop(txid, None)
        # Not the time spent queued behind earlier txids' commits: a smaller batch cannot
        # shorten that (with max_pending K it is up to K-1 whole commits), and shrinking
        # for it spirals down to the minimum size on a commit-bound sink.
        latency = None if started is None else now - started - command.queued_s
        self.stats.timings.append(
            TxTiming(
                txid,
                steps.get("store", 0.0),
                steps.get("emit", 0.0),
                steps.get("process", 0.0),
                steps.get("commit", 0.0),
                steps.get("advance", 0.0),
                latency,
                steps.get("prepare", 0.0),
                self._jobs.pop(txid, None),
                steps.get("decide", 0.0),
                steps.get("verify", 0.0),
                command.queued_s,
            )
        )
        round_ = self._rounds.pop(txid, None)
        if self.batch_size is not None and latency is not None:
            self.batch_size.on_commit(latency, command.records, round_, at=now)


class Outcomes(Probe):
    """What the committers did with each committed txid, and the run listener."""

    def __init__(self, stats: RunStats, listener: RunListener | None) -> None:
        self.stats = stats
        self.listener = listener
        self._outcomes: dict[int, Sequence[CommitOutcome]] = {}

    def on_outcomes(self, attempt: TransactionAttempt, outcomes: Sequence[CommitOutcome]) -> None:
        self._outcomes[attempt.txid] = outcomes

    def on_command(self, command: m.Command, now: float) -> None:
        if isinstance(command, m.Acknowledge):
            outcomes = self._outcomes.pop(command.attempt.txid, ())
            self.stats.outcomes.update(o.value for o in outcomes)
            log.debug(
                "txid committed txid=%d records=%d outcomes=%s",
                command.attempt.txid,
                command.records,
                list(outcomes),
            )
        elif isinstance(command, m.Cancel):
            self._outcomes.pop(command.attempt.txid, None)
        elif isinstance(command, m.Skip):
            if command.in_sink:
                self._listen("on_commit", command.attempt.txid, command.records or 0)
            else:
                self._listen("on_drop", command.attempt.txid, command.records)

    def on_event(self, event: m.Event, now: float) -> None:
        if isinstance(event, m.Opened):
            for txid in event.dropped:
                self._listen("on_drop", txid, None)

    def _listen(self, hook: str, txid: int, records: int | None) -> None:
        heard = getattr(self.listener, hook, None)
        if heard is not None:
            heard(txid, records)

    def acknowledged(self, command: m.Acknowledge) -> None:
        """After the spout's hooks: the listener hears of the commit last."""
        if self.listener is not None:
            self.listener.on_commit(command.attempt.txid, command.records)


class Logs(Probe):
    """The protocol's log lines: quiet by default (DEBUG), failures at WARNING."""

    def on_command(self, command: m.Command, now: float) -> None:
        match command:
            case m.Emit(attempt) | m.Replay(attempt):
                replay = isinstance(command, m.Replay)
                log.debug(
                    "txid starting txid=%d attempt=%s replay=%s", attempt.txid, attempt, replay
                )
            case m.Backoff(txid, error, phase, failures) | m.Halt(
                _, error, txid, phase, failures
            ) if txid is not None and isinstance(error, Exception):
                log.warning(
                    "txid failed txid=%d phase=%s failures=%d error=%s: %s",
                    txid,
                    phase,
                    failures,
                    type(error).__name__,
                    error,
                )
            case m.Retract(attempt):
                log.debug("empty batch retracted txid=%d", attempt.txid)
