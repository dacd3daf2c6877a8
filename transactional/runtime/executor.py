"""Carries out the state machine's commands on Spark and threads, and turns what came of
them into events: the only place with threads and Spark job groups.

Threads: the coordinator (the caller of ``run``) feeds the machine and carries out
every command except two: processing (bolts and the committers' ``prepare``) runs on
``max_pending`` worker threads, commits on one commit thread (on ``max_pending`` when
commits overlap, ``Machine.overlap``). Those report back through
one queue; the coordinator feeds the reports to the machine in arrival order. Each
attempt's Spark jobs run in a job group of their own, cancelled when the attempt is
dropped.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from transactional.errors import (
    ConfigurationError,
    CoordinatorError,
    LostLeadershipError,
    TransactionalError,
)
from transactional.faults import FaultPoint
from transactional.runtime import messages as m
from transactional.runtime.commit import CommitSequence
from transactional.runtime.drivers import Batch, SpoutDriver, job_group
from transactional.runtime.halts import halt_error
from transactional.runtime.kept import Kept, Releaser
from transactional.runtime.leadership import LeaderSession
from transactional.runtime.machine import Machine
from transactional.runtime.pipeline import Maker, Pipeline, describer, refusal
from transactional.runtime.probes import Faults, Outcomes, Probe, RunStats
from transactional.runtime.quiet import quietly
from transactional.runtime.settle import opened
from transactional.spark.engine import Digest, Engine
from transactional.topology import Topology
from transactional.types import CommitOutcome, Guarantee, TransactionAttempt

log = logging.getLogger("transactional.runner")

#: How long a clean close waits for the releases under way (milliseconds each on a
#: classic session; a Connect client whose server is gone may retry far longer).
RELEASE_WAIT_S = 10.0


@dataclass(frozen=True)
class Report:
    """What a worker or the commit thread hands the coordinator: an event, with what
    the event itself does not carry (prepared results, digests, commit outcomes), or
    ``crash``: the process going down (a ``BaseException`` that is not an ``Exception``:
    ``SystemExit``, a simulated crash), which ends the run at once, as a kill would."""

    event: m.Event | None
    prepared: Sequence[Any] = ()
    digests: dict[int, Digest] | None = None
    kept: Kept = field(default_factory=Kept)
    outcomes: Sequence[CommitOutcome] = ()
    crash: BaseException | None = None


@dataclass(eq=False)
class Executor:
    """Runs one topology's machine until stopped, drained or halted."""

    topology: Topology
    machine: Machine
    driver: SpoutDriver
    session: LeaderSession
    engine: Engine
    faults: Faults
    probes: list[Probe]
    outcomes: Outcomes
    stats: RunStats
    stopping: threading.Event
    clock: Callable[[], float]

    def __post_init__(self) -> None:
        self.probes = [*self.probes, self.outcomes]
        self.sequence = CommitSequence(
            self.topology.committers, self.driver.replays_exactly, self.faults.check
        )
        self.pipeline = Pipeline(
            self.topology,
            self.driver,
            self.engine,
            self.faults,
            self._measure,
            self.session.topology_id,
            ledger=self.machine.settings.ledger,
        )
        self.reports: queue.Queue[Report] = queue.Queue()
        self._results: dict[TransactionAttempt, Report] = {}
        #: What each processed attempt keeps in Spark until it is committed or dropped.
        self._releaser = Releaser(self.engine)
        self._workers = ThreadPoolExecutor(self.machine.settings.max_pending, "txn-process")
        self._committer = ThreadPoolExecutor(self.machine.overlap, "txn-commit")
        #: Names this run's Spark job groups (``drivers.job_group``).
        self.run = uuid.uuid4().hex[:8]

    # ------------------------------------------------------------------ the loop

    def wake(self) -> None:
        """Interrupt the coordinator's wait (``stop`` from another thread)."""
        self.reports.put(Report(None))

    def turn(self, until_drained: bool) -> bool:
        """One turn of the coordinator loop: due starts, commit, timeouts, then the next
        report. True once drained."""
        self.feed(m.Tick())
        now = self.clock()
        if until_drained and self.machine.drained(now):
            return True
        try:
            report = self.reports.get(timeout=self.machine.wait_time(now))
        except queue.Empty:
            return False
        self.receive(report)
        return False

    def receive(self, report: Report) -> None:
        if report.crash is not None:
            raise report.crash
        if report.event is None:
            return  # a wake-up
        event = report.event
        if isinstance(event, m.Processed):
            if self.machine.is_current(event.attempt):
                self._results[event.attempt] = report
                self._releaser.keep(event.attempt, report.kept)
            else:  # superseded while processing: nothing will read it
                self._releaser.release(report.kept)
        elif isinstance(event, m.Committed):
            for probe in self.probes:
                probe.on_outcomes(event.attempt, report.outcomes)
        self.feed(event)

    def feed(self, event: m.Event) -> None:
        """Give the machine ``event`` and carry out its commands, and theirs, in order."""
        events = [event]
        while events:
            event = events.pop(0)
            now = self.clock()
            for probe in self.probes:
                probe.on_event(event, now)
            commands = self.machine.step(event, now)
            self.stats.count(self.machine.counts)
            for command in commands:
                for probe in self.probes:
                    probe.on_command(command, now)
                events.extend(self.execute(command))

    # ------------------------------------------------------------------ commands

    def execute(self, command: m.Command) -> list[m.Event]:
        """Carry out one command; the events that came of it at once."""
        match command:
            case m.Emit(attempt, number) | m.Replay(attempt, number):
                return self._start(command, attempt, number)
            case m.Verify(attempt):
                return self._verify(attempt)
            case m.Commit():
                return self._commit(command)
            case m.Advance(attempt, through):
                return self._guarded(attempt, m.Phase.ADVANCE, partial(self._advance, through))
            case m.Retract(attempt):
                return self._guarded(attempt, m.Phase.RETRACT, self._retract)
            case m.Acknowledge():
                self._acknowledge(command)
            case m.Cancel(attempt, failed):
                self._cancel(attempt, failed)
            case m.Drop():
                self._report_drop(command)
            case m.Skip(attempt):
                return self._guarded_skip(command)
            case m.Reacquire(error):
                return self._reacquire(error)
            case m.Halt():
                raise halt_error(
                    command,
                    self.session.topology_id,
                    self.machine.counts.reelections,
                    self.machine.settings.max_reelections,
                    self.driver.stored_meta,
                )
        return []

    def _start(
        self, command: m.Emit | m.Replay, attempt: TransactionAttempt, number: int
    ) -> list[m.Event]:
        if self.stopping.is_set():  # start nothing more; the loop ends at its next check
            return [m.NotReady(attempt.txid)]
        began = time.perf_counter()
        try:
            self.engine.revive()  # a Connect session whose server restarted, reopened
            if isinstance(command, m.Replay):
                batch: Batch | None = self.driver.replay(attempt, number)
            else:
                batch = self.driver.new_batch(attempt, number)
        except Exception as exc:  # a user's spout raised: the same as any failure of txid
            stored = self.driver.has_stored(attempt.txid)
            error = refusal(exc, Maker("spout", self.driver.name))
            return [m.Failed(attempt, error, m.Phase.START, stored=stored)]
        if batch is None:
            return [m.NotReady(attempt.txid)]
        self._measure(attempt, "decide", began)
        for probe in self.probes:
            probe.on_measure(attempt, "store", batch.store_s)
        self._workers.submit(self._process, batch)
        # A spout that cannot tell its lag (None) is taken to be ahead.
        lag = quietly(self.driver.spout.lag, "read the spout's lag")
        return [m.Started(attempt, backlog=lag is None or lag > 0)]

    def _verify(self, attempt: TransactionAttempt) -> list[m.Event]:
        result = self._results.get(attempt)
        batch = self.driver.batches[attempt.txid]
        began = time.perf_counter()
        try:
            self.driver.verify(batch, result.digests if result else None)
        except TransactionalError as exc:  # lost leadership is routed by the machine
            return [m.Failed(attempt, exc, m.Phase.PROCESS)]
        self._measure(attempt, "verify", began)
        return [m.Verified(attempt)]

    def _commit(self, command: m.Commit) -> list[m.Event]:
        attempt, members = command.attempt, command.members
        try:
            self.session.check()  # a runner that lost leadership must not commit
        except LostLeadershipError as lost:
            return [m.LeadershipLost(lost)]
        if len(members) > 1:
            last = members[-1][0].txid
            try:  # before any sink sees the group: a replay commits exactly this group
                self.driver.store.record_group(attempt.txid, last)
            except CoordinatorError as exc:  # lost leadership is routed by the machine
                return [m.Failed(attempt, exc, m.Phase.COMMIT)]
        prepared = [self._results.pop(a).prepared for a, _ in members]
        self._committer.submit(self._commit_on_thread, members, prepared)
        return []

    def _guarded(
        self, attempt: TransactionAttempt, phase: m.Phase, step: Callable[[Batch], m.Event]
    ) -> list[m.Event]:
        """A store write of the coordinator: a store failure fails the txid."""
        try:
            return [step(self.driver.batches[attempt.txid])]
        except CoordinatorError as exc:  # lost leadership is routed by the machine
            return [m.Failed(attempt, exc, phase)]

    def _advance(self, through: int, batch: Batch) -> m.Event:
        began = time.perf_counter()
        self.driver.advance(self.driver.batches[through], first=batch.txid)
        for probe in self.probes:
            probe.on_measure(batch.attempt, "advance", time.perf_counter() - began)
        return m.Advanced(batch.attempt)

    def _retract(self, batch: Batch) -> m.Event:
        self.driver.retract(batch)
        return m.Retracted(batch.attempt)

    def _acknowledge(self, command: m.Acknowledge) -> None:
        txid = command.attempt.txid
        self._releaser.drop(command.attempt)
        batch = self.driver.batches.pop(txid)
        try:
            self.faults.check(FaultPoint.AFTER_ADVANCE, command.attempt, command.number)
            self.driver.acknowledge(batch)
        except Exception as exc:  # the txid is committed; hooks are best-effort
            log.warning("post-commit hook failed txid=%d error=%r", txid, exc)
        self.outcomes.acknowledged(command)

    def _report_drop(self, command: m.Drop) -> None:
        """``at_most_once``: a failed txid is dropped, never retried: said once, with
        what its batch was, so that what was lost can be found (and read again by
        hand)."""
        txid = command.attempt.txid
        log.warning(
            "txid dropped guarantee=at_most_once txid=%d phase=%s error=%s: %s; it is never "
            "retried; its batch: %s",
            txid,
            command.phase,
            type(command.error).__name__,
            command.error,
            self.driver.stored_meta(txid),
        )

    def _guarded_skip(self, command: m.Skip) -> list[m.Event]:
        attempt = command.attempt
        try:
            public = self.driver.skip(attempt.txid)
        except CoordinatorError as exc:  # lost leadership is routed by the machine
            return [m.Failed(attempt, exc, m.Phase.ADVANCE)]
        self._releaser.drop(attempt)
        try:
            self.driver.acknowledge_skipped(attempt.txid, public)
        except Exception as exc:  # the store moved past it; hooks are best-effort
            log.warning("post-drop hook failed txid=%d error=%r", attempt.txid, exc)
        return [m.Skipped(attempt)]

    def _cancel(self, attempt: TransactionAttempt, failed: bool) -> None:
        self._results.pop(attempt, None)
        quietly(lambda: self.engine.cancel(self._group(attempt)), "cancel job group")
        self._releaser.drop(attempt)
        quietly(lambda: self.driver.drop(attempt.txid, failed), "spout fail")

    def _reacquire(self, error: LostLeadershipError) -> list[m.Event]:
        topology_id = self.session.topology_id
        log.warning(
            "leadership lost topology=%s currtx=%d error=%s: %s; in-flight txids dropped, "
            "taking leadership back",
            topology_id,
            self.machine.currtx,
            type(error).__name__,
            error,
        )
        try:
            state = self.session.reacquire()
        except LostLeadershipError as exc:
            log.error("deposed or cut off topology=%s; stopping: %s", topology_id, exc)
            raise
        if state is None:
            return []  # asked to stop meanwhile
        stored = self.driver.load(state)
        log.warning(
            "leadership taken back topology=%s currtx=%d replays=%s fence=%s",
            topology_id,
            state.currtx,
            sorted(t for t in stored if t >= state.currtx),
            self.session.token,
        )
        guarantee = self.machine.settings.guarantee
        return [opened(self.driver, self.topology.committers, state, stored, guarantee)]

    # ------------------------------------------------------------------ threads

    def _process(self, batch: Batch) -> None:
        """Worker thread: build the batch, read it once, run the bolts and ``prepare``."""
        attempt = batch.attempt
        try:
            with self.engine.job_group(self._group(attempt), attempt.txid):
                processed = self.pipeline.run(batch)
            report = Report(processed.event, processed.prepared, processed.digests, processed.kept)
        except Exception as exc:  # reported to the coordinator thread, never lost
            report = Report(m.Failed(attempt, exc, m.Phase.PROCESS))
        except BaseException as exc:
            report = Report(None, crash=exc)
        self.reports.put(report)

    def _commit_on_thread(
        self,
        members: Sequence[tuple[TransactionAttempt, int]],
        prepared: Sequence[Sequence[Any]],
    ) -> None:
        """Commit thread: the ordered commit of one txid or group
        (``commit.CommitSequence``). A group's commit time is shared by its txids."""
        attempt, number = members[0]
        self.reports.put(Report(m.CommitBegan(attempt)))
        began = time.perf_counter()
        try:
            with self.engine.job_group(self._group(attempt)):
                describer(self.engine, self.session.topology_id, attempt, number)("commit")
                outcomes = self.sequence.commit(members, prepared)
            share = (time.perf_counter() - began) / len(members)
            for member, _ in members:
                for probe in self.probes:
                    probe.on_measure(member, "commit", share)
            jobs = quietly(lambda: self.engine.jobs(self._group(attempt)), "count Spark jobs")
            for probe in self.probes:
                probe.on_jobs(attempt, jobs)
            self.stats.resolved_commits = self.sequence.resolved
            report = Report(m.Committed(attempt), outcomes=outcomes)
        except Exception as exc:
            report = Report(m.Failed(attempt, exc, m.Phase.COMMIT))
            if self._held_anyway(members[-1][0].txid, exc):
                report = Report(m.Committed(attempt))
        except BaseException as exc:
            report = Report(None, crash=exc)
        self.reports.put(report)

    def _held_anyway(self, txid: int, exc: Exception) -> bool:
        """``at_most_once``: a commit that raised is dropped, unless every sink holds
        its txid anyway (a failure after the writes): then it is committed, since what a
        drop reports lost must be lost. The other guarantees replay it instead."""
        if self.machine.settings.guarantee is not Guarantee.AT_MOST_ONCE:
            return False
        if isinstance(exc, LostLeadershipError | ConfigurationError):
            return False
        try:
            held = [node.committer.committed_txid() for node in self.topology.committers]
        except Exception:  # unreadable: it counts as dropped
            return False
        if all(h is not None and h >= txid for h in held):
            log.warning(
                "commit raised but every sink holds the txid txid=%d error=%r: committed",
                txid,
                exc,
            )
            return True
        return False

    def _group(self, attempt: TransactionAttempt) -> str:
        return job_group(attempt, self.run)

    def _measure(self, attempt: TransactionAttempt, step: str, began: float) -> None:
        for probe in self.probes:
            probe.on_measure(attempt, step, time.perf_counter() - began)

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Cancel what is in flight. A commit already running is let finish, and on a
        requested stop (Ctrl-C, SIGTERM) waited for, and advanced past if it succeeded:
        cancelling it could leave one sink written and the next not, until a replay."""
        committing = set(self.machine.running_commits())
        for attempt in self.machine.in_flight():
            if attempt.txid not in committing:
                quietly(partial(self.engine.cancel, self._group(attempt)), "cancel job group")
        self._workers.shutdown(wait=False, cancel_futures=True)
        stopped = self.stopping.is_set()
        if stopped and committing:
            log.info(
                "stopping topology=%s: waiting for the commit of txid(s) %s to finish",
                self.session.topology_id,
                ",".join(str(t) for t in sorted(committing)),
            )
        self._committer.shutdown(wait=stopped, cancel_futures=True)
        if stopped and committing:
            self._advance_finished_commits()
        if not committing or stopped:  # no commit thread still reads a batch
            self._release_left()
            # Done before the run returns: its caller may stop Spark at once, which
            # would fail a release still under way (a warning after a clean end).
            self._releaser.settle(RELEASE_WAIT_S)
        self._releaser.shutdown(wait=False)

    def join(self) -> None:
        """Wait for the worker and commit threads to stop, then release what their
        attempts kept in Spark."""
        self._workers.shutdown(wait=True)
        self._committer.shutdown(wait=True)
        self._release_left()
        self._releaser.shutdown(wait=True)

    def _release_left(self) -> None:
        """Release every attempt's kept blocks: those processed and not committed, and
        those a worker reported after the run stopped listening."""
        self._releaser.release_all()
        while True:
            try:
                report = self.reports.get_nowait()
            except queue.Empty:
                return
            self._releaser.release(report.kept)

    def _advance_finished_commits(self) -> None:
        """On a stop, once the commit threads are done: the store moves past the commits
        that succeeded, in txid order, up to the first that did not. The machine is
        told of the stop first: it starts and commits nothing more."""
        try:
            self.feed(m.StopRequested())
        except Exception as exc:  # what runs replays, and its sinks skip it
            log.warning("stop not taken error=%r", exc)
            return
        while True:
            try:
                report = self.reports.get_nowait()
            except queue.Empty:
                return
            event = report.event
            if isinstance(event, m.Committed) and self.machine.is_current(event.attempt):
                try:
                    self.receive(report)
                except Exception as exc:  # it replays, and its sinks skip it
                    txid = event.attempt.txid
                    log.warning("advance on stop failed txid=%d error=%r", txid, exc)
                    return
