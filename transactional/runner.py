"""The runner: the transaction state machine of DESIGN.md section 4.

The protocol, as this module runs it (``currtx`` is the next txid to commit):

1. **Start.** While fewer than ``max_pending`` txids are in flight (the window is
   always ``[currtx, currtx + max_pending)``), start the next txid ``t``. If the store
   holds metadata for ``t`` (a replay after a failure or a restart), reuse it as is and
   do not ask ``is_ready``. Otherwise, if ``is_ready``, decide the metadata
   (``initialize_transaction`` / ``emit_partition_batch_new``, once per txid, from the
   metadata of ``t - 1``) and write it to the store *before* anything is
   emitted. Opaque spouts emit here, in txid order, each partition continuing from
   where ``t - 1`` stopped; their partition metadata is stored only at commit.
   A new txid whose metadata is what was last found empty (see 2) is not started:
   the source is still idle, and polls back off from ``poll_interval_s`` to
   ``poll_max_s`` until a batch holds records.
2. **Process** (worker threads, several txids at once): build the batch, materialise
   it once (so every bolt and committer of this attempt sees the same rows, even
   from a non-deterministic source), run the bolts, and let each committer
   ``prepare`` its inputs. Each attempt runs in its own Spark job group. Every
   contract breach of a component is a ``ContractError`` (``transactional.contracts``).
   Then, on the coordinator thread, before the txid may commit: with
   ``check_determinism`` (transactional and partitioned spouts), the first emit's
   record count and content checksum per partition are stored
   (``StateStore.record_digest``), and a replay that differs stops the runner with
   ``NondeterministicSpoutError`` before any sink sees it. A batch with no records is
   not committed (unless the spout sets ``commit_empty_batches``): its txid and every
   txid above it are dropped and forgotten by the store (``StateStore.retract``), to be
   decided again at a later poll.
3. **Commit** (one commit thread, strictly in txid order): only ``t == currtx``, once
   processed, after checking this runner still leads. Every committer commits ``t``
   atomically with ``t`` recorded in its sink, in the order they were added.
4. **Advance**: after every committer succeeded, one fenced store write sets
   ``currtx = t + 1`` (with opaque partition metadata) and deletes metadata below
   ``t``; then the spout's ``cleanup_before`` and ``ack`` hooks run.
5. **Failure** of ``t`` in start, emit, process or commit (an exception, or the
   attempt timeout, which cancels its Spark job group): ``t`` and every in-flight txid
   above it are dropped and started again, after a back-off, with new attempt ids and
   the same stored metadata (opaque: from the last committed partition metadata).
   After ``max_attempts`` failures of one txid the runner stops with
   ``PoisonBatchError``; the store keeps everything needed to resume. A
   ``ConfigurationError`` (also the ``ContractError`` raised here when a spout or bolt
   returns the wrong thing) fails the same way on every attempt, so it is not retried:
   the runner stops at once with ``BatchConfigurationError``. Results and
   commits of a superseded attempt are ignored when they arrive.
6. **Restart**: read ``currtx`` and all stored metadata, replay every started but
   uncommitted txid with its stored metadata, and only then start new ones. The
   committers skip (transactional) or undo and reapply (opaque) what they had applied.
7. **Lost leadership** (the store raises ``LostLeadershipError``: a session that
   expired, a store that restarted, a fenced write): stop committing at once, drop and
   cancel everything in flight, and take leadership again on the same store within
   ``leader_timeout_s``; then re-read the state and go on as after a restart (step 6),
   with the store's new fence token handed to the committers. A runner that finds it
   was deposed (``FencedError``: a sink or the store holds a newer leader's fence; or
   another runner holds the leadership by now) stops instead, writing nothing more.

A commit that raised may have been applied anyway (a reply lost to a timeout): before
treating it as a failure, the runner reads the txid the sink holds
(``Committer.committed_txid``) and, if the sink has it, goes on without committing
again. It never guesses.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from transactional import contracts
from transactional.bolt import DEFAULT_STREAM
from transactional.committer import Committer, CommitterContext
from transactional.config import RunnerConfig
from transactional.engine import Digest, Engine, SparkEngine
from transactional.errors import (
    AttemptTimeoutError,
    BatchConfigurationError,
    ConfigurationError,
    ContractError,
    CoordinatorError,
    FencedError,
    LostLeadershipError,
    NondeterministicSpoutError,
    PoisonBatchError,
    TransactionalError,
)
from transactional.faults import FaultPlan, FaultPoint
from transactional.flow import HISTORY, AdaptiveBatchSize
from transactional.leadership import reacquire
from transactional.spout import SpoutContext
from transactional.store import StateStore, StoredState, TopologyIdentity
from transactional.topology import SPOUT, Topology
from transactional.types import (
    BatchMetadata,
    CommitOutcome,
    SpoutKind,
    TransactionAttempt,
    dump_meta,
)

log = logging.getLogger("transactional.runner")


class RunListener(Protocol):
    def on_commit(self, txid: int, records: int) -> None: ...


@dataclass
class RunStats:
    committed_txids: int = 0
    records: int = 0
    failures: int = 0
    stale_ignored: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    last_committed: int = 0
    #: Times leadership was lost and taken back during the run (step 7).
    reelections: int = 0
    #: Commits that raised but that the sink held: resolved by reading it, not redone.
    resolved_commits: int = 0
    #: Batches found empty and not committed (their txids retracted): idle polls.
    empty_polls: int = 0
    #: Where the latest committed txids' time went (their last, successful attempt).
    timings: deque[TxTiming] = field(default_factory=lambda: deque(maxlen=HISTORY))


@dataclass(frozen=True)
class TxTiming:
    """Seconds per protocol step of one committed txid: ``store`` writes its metadata,
    ``emit`` builds and materialises the batch, ``process`` runs the bolts and the
    committers' ``prepare``, ``commit`` the committers, ``advance`` the fenced store write.
    ``latency`` is what the adaptive batch size is fed: from its metadata stored to its
    commit done, through every attempt, less the time it sat processed, queued behind
    earlier commits."""

    txid: int
    store_s: float
    emit_s: float
    process_s: float
    commit_s: float
    advance_s: float
    latency_s: float | None = None


@dataclass
class _Slot:
    """One in-flight txid and its current attempt."""

    attempt: TransactionAttempt
    number: int  # attempt number of this txid in this run, 1-based
    meta: Any  # coordinator metadata (transactional) or the partition count record
    partitions: dict[int, BatchMetadata]  # partitioned: stored; opaque: emitted
    frames: dict[int, Any]  # opaque: the frames emitted on the coordinator thread
    started: float
    state: str = "processing"  # -> "processed" -> "committing"
    records: int = 0
    prepared: list[Any] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)  # step -> seconds
    deadline: float | None = None
    processed_at: float | None = None
    #: Seconds this attempt, processed, waited for the commit of earlier txids.
    queued_s: float = 0.0

    @property
    def txid(self) -> int:
        return self.attempt.txid

    @property
    def group(self) -> str:
        return f"txid-{self.attempt.txid}-attempt-{self.attempt.attempt_id}"


@dataclass(frozen=True)
class _Processed:
    """What a worker hands back for one attempt: its record count, each committer's
    prepared result, and the digest of each partition it read (None: not computed)."""

    records: int
    prepared: list[Any]
    digests: dict[int, Digest] | None


@dataclass(frozen=True)
class _Event:
    kind: str  # "processed" | "process_failed" | "committed" | "commit_failed"
    attempt: TransactionAttempt
    payload: Any


class TransactionalRunner:
    """Runs one topology against one state store until stopped or drained."""

    def __init__(
        self,
        topology: Topology,
        store: StateStore,
        spark: Any = None,
        config: RunnerConfig | None = None,
        *,
        faults: FaultPlan | None = None,
        listener: RunListener | None = None,
        engine: Engine | None = None,
        clock: Callable[[], float] = time.monotonic,
        batch_size: AdaptiveBatchSize | int | None = None,
    ) -> None:
        if config is None:
            raise TypeError("config is required: RunnerConfig(topology_id=...)")
        if engine is None:
            if spark is None:
                raise TypeError("a SparkSession (spark=...) or an engine is required")
            engine = SparkEngine(spark)
        self.topology = topology
        self.store = store
        self.config = config
        self.engine = engine
        self.faults = faults
        self.listener = listener
        #: Sizes of new txids: flow control (``--batch-size auto``), a fixed size the spout
        #: reads through ``SpoutContext.batch_size`` (``--batch-size N``), or None: its own.
        self._sizing = batch_size
        self.batch_size = batch_size if isinstance(batch_size, AdaptiveBatchSize) else None
        self._first_started: dict[int, float] = {}  # txid -> when its first attempt began
        self._store_times: dict[int, float] = {}  # txid -> seconds to store its metadata
        self.clock = clock
        self.stats = RunStats()
        self._spout = topology.spout
        self._spout_name = contracts.component("spout", SPOUT, topology.spout)
        self._kind = topology.kind
        # Opaque spouts may emit another batch on replay by definition: nothing to check.
        self._digest = config.check_determinism and self._kind is not SpoutKind.OPAQUE
        self._events: queue.Queue[_Event] = queue.Queue()
        self._stop = threading.Event()
        self._attempt_ids = itertools.count(1)
        self._slots: dict[int, _Slot] = {}
        self._failures: Counter[int] = Counter()
        #: Attempts of each uncommitted txid in this run, counting the ones dropped because
        #: a lower txid failed: fault plans and logs number attempts by it.
        self._attempts: Counter[int] = Counter()
        #: (txid, decision) of the last batch found empty and retracted: the same decision
        #: again means the source is still idle, and is neither stored nor emitted.
        self._idle: tuple[int, Any] | None = None
        self._poll_interval = config.poll_interval_s
        #: txid -> digest of its first emit, as stored (``check_determinism``).
        self._digests: dict[int, Any] = {}
        self._committing: _Slot | None = None
        self._retry_at = 0.0
        self._poll_at = 0.0
        self._not_ready = False
        # Stored state mirrored in memory; the store stays the source of truth on restart.
        self._currtx = 1
        self._next_txid = 1
        self._metas: dict[int, Any] = {}
        self._partitions: dict[int, dict[int, BatchMetadata]] = {}
        self._workers: ThreadPoolExecutor | None = None
        self._committer_thread: ThreadPoolExecutor | None = None
        self._contexts: list[CommitterContext] = []

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask the runner to stop after the step it is in; safe from any thread."""
        self._stop.set()
        self._events.put(_Event("wakeup", TransactionAttempt(0, 0), None))

    def run(self, until_drained: bool = False) -> RunStats:
        """Run until ``stop()``, or, with ``until_drained``, until ``is_ready`` says no
        with nothing in flight and everything committed."""
        self._open()
        try:
            while not self._stop.is_set():
                try:
                    if self._step(until_drained):
                        break
                except LostLeadershipError as lost:
                    self._regain_leadership(lost)
        finally:
            self._close()
        return self.stats

    def _step(self, until_drained: bool) -> bool:
        """One turn of the coordinator loop; True once drained."""
        self._start_transactions()
        if until_drained and self._drained():
            return True
        self._maybe_commit()
        self._check_timeouts()
        try:
            event = self._events.get(timeout=self._wait_time())
        except queue.Empty:
            return False
        self._handle(event)
        return False

    def _open(self) -> None:
        cfg = self.config
        self.store.open(cfg.topology_id)
        self.store.register(TopologyIdentity(self._spout.identity(), self._kind.value))
        log.info("acquiring leadership topology=%s (a standby waits here)", cfg.topology_id)
        self.store.acquire_leadership(cfg.leader_timeout_s)
        replays = self._load_state(self.store.read_state())
        log.info(
            "runner started topology=%s currtx=%d replays=%s max_pending=%d fence=%s",
            cfg.topology_id,
            self._currtx,
            replays,
            cfg.max_pending,
            self.store.fence_token(),
        )
        self._spout.open(SpoutContext(self.engine.spark, cfg.topology_id, self._sizing))
        token = self.store.fence_token()
        for node in self.topology.committers:
            context = CommitterContext(
                self.engine.spark, cfg.topology_id, node.name, token, self.store.check_leadership
            )
            self._contexts.append(context)
            node.committer.open(context)
        self._workers = ThreadPoolExecutor(cfg.max_pending, thread_name_prefix="txn-process")
        self._committer_thread = ThreadPoolExecutor(1, thread_name_prefix="txn-commit")

    def _close(self) -> None:
        # A commit already running is let finish, and on a requested stop (Ctrl-C,
        # SIGTERM) waited for, before the committers and the store close: cancelling it
        # could leave one sink written and the next not, until a replay.
        for slot in self._slots.values():
            if slot is not self._committing:
                self._cancel(slot)
        if self._workers is not None:
            self._workers.shutdown(wait=False, cancel_futures=True)
        if self._committer_thread is not None:
            self._committer_thread.shutdown(wait=self._stop.is_set(), cancel_futures=True)
        if self._stop.is_set() and self._committing is not None:
            self._advance_finished_commit()
        for node in self.topology.committers:
            _quietly(node.committer.close, "committer close")
        _quietly(self._spout.close, "spout close")
        _quietly(self.store.close, "store close")

    def _advance_finished_commit(self) -> None:
        """On a requested stop, a commit that was running has finished by now: advance
        past it if it succeeded, so the store does not replay a txid its sinks hold."""
        committing = self._committing
        while committing is not None:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            if event.kind == "committed" and event.attempt == committing.attempt:
                try:
                    self._handle(event)
                except Exception as exc:  # it replays, and its sinks skip it
                    log.warning("advance on stop failed txid=%d error=%r", committing.txid, exc)
                return

    def _load_state(self, state: StoredState) -> list[int]:
        """Mirror the stored state (steps 6 and 7); returns the txids to replay."""
        self._currtx = self._next_txid = state.currtx
        self._metas.clear()
        self._partitions.clear()
        meta_type = self._spout.metadata_type
        for txid, value in state.metas.items():
            self._metas[txid] = (
                meta_type.model_validate(value) if self._kind is SpoutKind.TRANSACTIONAL else value
            )
        for txid, parts in state.partitions.items():
            self._partitions[txid] = {int(p): meta_type.model_validate(v) for p, v in parts.items()}
        self._digests = dict(state.digests)
        return sorted(t for t in self._metas if t >= self._currtx)

    def _regain_leadership(self, lost: LostLeadershipError) -> None:
        """Step 7. Whatever is in flight was started under the lost leadership: drop it,
        cancel its Spark jobs, and start again from the stored state. A commit already
        running cannot be stopped, but it is fenced, and the commit thread runs it
        before any commit made under the new leadership."""
        cfg = self.config
        self._drop_from(min(self._slots, default=self._currtx))
        self._committing = None
        if isinstance(lost, FencedError):
            log.error(
                "deposed: another runner leads topology=%s; a write of this runner was "
                "refused and it stops without writing anything more: %s",
                cfg.topology_id,
                lost,
            )
            raise lost
        self.stats.reelections += 1
        if self.stats.reelections > cfg.max_reelections:
            raise LostLeadershipError(
                f"lost the leadership of topology {cfg.topology_id!r} "
                f"{self.stats.reelections} times in this run (max_reelections="
                f"{cfg.max_reelections}); last: {lost}. Check the state store's health"
            ) from lost
        log.warning(
            "leadership lost topology=%s currtx=%d error=%s: %s; in-flight txids dropped, "
            "taking leadership back",
            cfg.topology_id,
            self._currtx,
            type(lost).__name__,
            lost,
        )
        try:
            state = reacquire(self.store, cfg.topology_id, cfg.leader_timeout_s, self._stop)
        except LostLeadershipError as exc:
            log.error("deposed or cut off topology=%s; stopping: %s", cfg.topology_id, exc)
            raise
        if state is None:
            return
        replays = self._load_state(state)
        token = self.store.fence_token()
        for context in self._contexts:
            context.fence_token = token
        self._retry_at = self._poll_at = 0.0
        self._not_ready = False
        log.warning(
            "leadership taken back topology=%s currtx=%d replays=%s fence=%s",
            cfg.topology_id,
            self._currtx,
            replays,
            token,
        )

    # ------------------------------------------------------------------ 1. start

    def _start_transactions(self) -> None:
        now = self.clock()
        if now < self._retry_at:
            return
        while self._next_txid < self._currtx + self.config.max_pending and not self._stop.is_set():
            txid = self._next_txid
            replay = txid in self._metas
            if not replay and now < self._poll_at:
                return
            try:
                started = self._start(txid, replay)
            except TransactionalError as exc:
                if isinstance(exc, LostLeadershipError):
                    raise
                self._fail(txid, exc, "start")
                return
            except Exception as exc:  # a user's spout raised: same as any failure of txid
                self._fail(txid, exc, "start")
                return
            if not started:
                self._idle_poll(now)
                return
            self._not_ready = False
            self._next_txid += 1

    def _idle_poll(self, now: float) -> None:
        """Nothing new: ask again after the poll interval, doubling it with every idle
        poll in a row up to ``poll_max_s`` (a batch with records resets it)."""
        self._not_ready = True
        self._poll_at = now + self._poll_interval
        self._poll_interval = min(self.config.poll_max_s, self._poll_interval * 2)

    def _start(self, txid: int, replay: bool) -> bool:
        spout: Any = self._spout
        who = self._spout_name
        self._attempts[txid] += 1
        attempt = TransactionAttempt(txid, next(self._attempt_ids))
        number = self._attempts[txid]
        partitions: dict[int, BatchMetadata] = {}
        frames: dict[int, Any] = {}
        if self._kind is SpoutKind.TRANSACTIONAL:
            if not replay:
                prev = self._metas.get(txid - 1)
                if not contracts.check_ready(spout.is_ready(txid, prev), who, txid):
                    return self._not_started(txid)
                meta = spout.initialize_transaction(txid, prev)
                self._check_meta(meta, "initialize_transaction")
                if self._still_idle(txid, dump_meta(meta)):
                    return self._not_started(txid)
                self._store_start(txid, dump_meta(meta), {})
                self._metas[txid] = meta
            meta = self._metas[txid]
        elif self._kind is SpoutKind.PARTITIONED:
            if not replay:
                last = self._partitions.get(txid - 1, {})
                count = contracts.check_partition_count(spout.num_partitions(), who)
                if count == 0 or not contracts.check_ready(spout.is_ready(txid, last), who, txid):
                    return self._not_started(txid)
                for p in range(count):
                    partitions[p] = spout.emit_partition_batch_new(attempt, p, last.get(p))
                    self._check_meta(partitions[p], "emit_partition_batch_new")
                stored = {p: dump_meta(m) for p, m in partitions.items()}
                if self._still_idle(txid, stored):
                    return self._not_started(txid)
                record = {"partitions": count}
                self._store_start(txid, record, stored)
                self._metas[txid], self._partitions[txid] = record, partitions
            meta, partitions = self._metas[txid], self._partitions[txid]
        else:
            last = self._emitted_before(txid)
            if not replay:
                count = contracts.check_partition_count(spout.num_partitions(), who)
                if count == 0 or not contracts.check_ready(spout.is_ready(txid, last), who, txid):
                    return self._not_started(txid)
                record = {"partitions": count}
                self._store_start(txid, record, {})
                self._metas[txid] = record
            meta = self._metas[txid]
            self._check_fault(FaultPoint.AFTER_STORE_META, attempt, number)
            self._check_fault(FaultPoint.EMIT, attempt, number)
            for p in range(int(meta["partitions"])):
                partitions[p], frames[p] = contracts.check_opaque_pair(
                    spout.emit_partition_batch(attempt, p, last.get(p)),
                    spout.metadata_type,
                    self.engine.is_frame,
                    who,
                    txid,
                    p,
                )
                self._check_meta(partitions[p], "emit_partition_batch")
            # An opaque batch is known only once emitted (lazily: no Spark job yet).
            if not replay and self._still_idle(
                txid, {p: dump_meta(m) for p, m in partitions.items()}
            ):
                self.store.retract(txid)
                del self._metas[txid]
                return self._not_started(txid)
        slot = _Slot(attempt, number, meta, partitions, frames, started=self.clock())
        if self.config.attempt_timeout_s is not None:
            slot.deadline = slot.started + self.config.attempt_timeout_s
        self._slots[txid] = slot
        self._first_started.setdefault(txid, slot.started)
        log.debug("txid started txid=%d attempt=%s replay=%s", txid, attempt, replay)
        assert self._workers is not None
        self._workers.submit(self._process, slot)
        return True

    def _not_started(self, txid: int) -> bool:
        self._attempts[txid] -= 1  # no attempt was made
        return False

    def _still_idle(self, txid: int, decision: Any) -> bool:
        """The spout decided, for ``txid``, exactly what was found empty last time."""
        return self._idle == (txid, decision)

    def _store_start(self, txid: int, meta: Any, partitions: Mapping[int, Any]) -> None:
        began = time.perf_counter()
        self.store.start_transaction(txid, meta, partitions)
        self._store_times[txid] = time.perf_counter() - began

    def _emitted_before(self, txid: int) -> dict[int, BatchMetadata]:
        """Opaque spouts: where each partition stood after ``txid - 1``: emitted by its
        in-flight attempt, or else as last committed."""
        previous = self._slots.get(txid - 1)
        if previous is not None:
            return previous.partitions
        committed: dict[int, BatchMetadata] = {}
        for t in sorted(t for t in self._partitions if t < txid):
            committed.update(self._partitions[t])
        return committed

    def _check_meta(self, meta: object, method: str) -> None:
        """Refuse metadata the store cannot hold *before* anything is stored: a replay
        rebuilds the batch from the stored JSON alone, so it must load back unchanged."""
        spout = self._spout_name
        expected = self._spout.metadata_type
        if not isinstance(meta, expected):
            raise ContractError(
                f"{spout}.{method} returned {contracts.qualified(meta)}; it must return "
                f"its metadata_type {expected.__name__}"
            )
        problem = _json_problem(meta)
        if problem is not None:
            raise ContractError(
                f"{spout}.{method} returned {expected.__name__} metadata that JSON cannot "
                f"hold: {problem}. Metadata must be plain JSON values (no NaN or infinity, "
                f"no bytes): change that field's type or value in {expected.__name__}"
            )

    # ------------------------------------------------------------------ 2. process

    def _process(self, slot: _Slot) -> None:
        attempt = slot.attempt
        try:
            with self.engine.job_group(slot.group):
                result = self._build_and_prepare(slot)
            self._events.put(_Event("processed", attempt, result))
        except BaseException as exc:  # reported to the coordinator thread, never lost
            self._events.put(_Event("process_failed", attempt, exc))

    def _build_and_prepare(self, slot: _Slot) -> _Processed:
        spout: Any = self._spout
        attempt = slot.attempt
        txid = attempt.txid
        is_frame = self.engine.is_frame
        if self._kind is not SpoutKind.OPAQUE:
            self._check_fault(FaultPoint.AFTER_STORE_META, attempt, slot.number)
            self._check_fault(FaultPoint.EMIT, attempt, slot.number)
        if self._kind is SpoutKind.TRANSACTIONAL:
            emitted = spout.emit_batch(attempt, slot.meta)
            frames = [
                contracts.check_frame(emitted, is_frame, self._spout_name, "emit_batch", txid)
            ]
        elif self._kind is SpoutKind.PARTITIONED:
            frames = [
                contracts.check_frame(
                    spout.emit_partition_batch(attempt, p, slot.partitions[p]),
                    is_frame,
                    self._spout_name,
                    f"emit_partition_batch (partition {p})",
                    txid,
                )
                for p in range(int(slot.meta["partitions"]))
            ]
        else:
            frames = [slot.frames[p] for p in sorted(slot.frames)]
        began = time.perf_counter()
        read = self.engine.materialise(frames, self._digest)
        slot.times["emit"] = time.perf_counter() - began
        if read.records == 0 and not spout.commit_empty_batches:  # see _processed
            return _Processed(0, [], read.digests)
        began = time.perf_counter()
        streams: dict[tuple[str, str], Any] = {(SPOUT, DEFAULT_STREAM): read.batch}
        for node in self.topology.bolts:
            who = contracts.component("bolt", node.name, node.bolt)
            outputs = tuple(node.bolt.outputs)
            out = contracts.bolt_streams(
                node.bolt.process(attempt, streams[node.input]),
                outputs,
                is_frame,
                who,
                "process",
                txid,
            )
            out = contracts.bolt_streams(
                node.bolt.finish_batch(attempt, out), outputs, is_frame, who, "finish_batch", txid
            )
            for stream in outputs:
                streams[(node.name, stream)] = out[stream]
        self._check_fault(FaultPoint.PROCESS, attempt, slot.number)
        prepared = [
            node.committer.prepare(attempt, {k: streams[ref] for k, ref in node.inputs.items()})
            for node in self.topology.committers
        ]
        slot.times["process"] = time.perf_counter() - began
        return _Processed(read.records, prepared, read.digests)

    # ------------------------------------------------------------------ 3. commit

    def _maybe_commit(self) -> None:
        slot = self._slots.get(self._currtx)
        if slot is None or slot.state != "processed" or self._committing is not None:
            return
        self.store.check_leadership()  # a runner that lost leadership must not commit
        slot.state = "committing"
        slot.started = self.clock()
        if slot.processed_at is not None:
            slot.queued_s = slot.started - slot.processed_at
        # The commit's timeout starts when the commit thread takes it up (see _commit): a
        # commit queued behind a timed-out, still-running one has not begun yet.
        slot.deadline = None
        self._committing = slot
        assert self._committer_thread is not None
        self._committer_thread.submit(self._commit, slot)

    def _commit(self, slot: _Slot) -> None:
        attempt = slot.attempt
        if self.config.attempt_timeout_s is not None:
            slot.deadline = self.clock() + self.config.attempt_timeout_s
        began = time.perf_counter()
        try:
            outcomes = []
            with self.engine.job_group(slot.group):
                for i, (node, prepared) in enumerate(
                    zip(self.topology.committers, slot.prepared, strict=True)
                ):
                    if i < 2:  # each point once per attempt: only the first gap is named
                        point = (
                            FaultPoint.BEFORE_SINK_WRITE
                            if i == 0
                            else FaultPoint.BETWEEN_COMMITTERS
                        )
                        self._check_fault(point, attempt, slot.number)
                    outcomes.append(self._commit_one(node.name, node.committer, attempt, prepared))
                self._check_fault(FaultPoint.AFTER_SINK_WRITE, attempt, slot.number)
            slot.times["commit"] = time.perf_counter() - began
            self._events.put(_Event("committed", attempt, outcomes))
        except BaseException as exc:
            self._events.put(_Event("commit_failed", attempt, exc))

    def _commit_one(
        self, name: str, committer: Committer, attempt: TransactionAttempt, prepared: Any
    ) -> CommitOutcome:
        """Commit to one sink; if that raised, read what the sink holds rather than guess:
        a txid it holds is not committed again (its reply was lost, not its write)."""
        try:
            outcome = committer.commit(attempt, prepared)
        except (LostLeadershipError, ConfigurationError):
            raise  # step 7, or a refusal that every attempt would meet again
        except Exception as exc:
            # An opaque replay may emit another batch: only a fresh commit of this
            # attempt's own rows is exact, so the sink's txid settles nothing there.
            if self._kind is SpoutKind.OPAQUE:
                raise
            try:
                held = committer.committed_txid()
            except Exception as unreadable:
                log.warning(
                    "commit outcome unknown committer=%s txid=%d error=%r; the sink cannot "
                    "be read either (%r): replaying",
                    name,
                    attempt.txid,
                    exc,
                    unreadable,
                )
                raise exc from None
            if held is None or held < attempt.txid:
                raise
            self.stats.resolved_commits += 1  # only the commit thread writes it
            log.warning(
                "commit raised but the sink holds the txid committer=%s txid=%d held=%d "
                "error=%r: not committing it again",
                name,
                attempt.txid,
                held,
                exc,
            )
            return CommitOutcome.SKIPPED
        who = contracts.component("committer", name, committer)
        return contracts.check_outcome(outcome, who, attempt.txid)

    # ------------------------------------------------------------------ 4. advance

    def _advance(self, slot: _Slot, outcomes: list[CommitOutcome]) -> None:
        txid = slot.txid
        opaque = self._kind is SpoutKind.OPAQUE
        stored = {p: dump_meta(m) for p, m in slot.partitions.items()} if opaque else None
        began = time.perf_counter()
        self.store.advance(txid, stored)
        t = slot.times
        started = self._first_started.pop(txid, None)
        # Not the time spent queued behind earlier txids' commits: a smaller batch cannot
        # shorten that (with max_pending K it is up to K-1 whole commits), and shrinking
        # for it spirals down to the minimum size on a commit-bound sink.
        latency = None if started is None else self.clock() - started - slot.queued_s
        self.stats.timings.append(
            TxTiming(
                txid,
                self._store_times.pop(txid, 0.0),
                t.get("emit", 0.0),
                t.get("process", 0.0),
                t.get("commit", 0.0),
                time.perf_counter() - began,
                latency,
            )
        )
        self._committing = None
        self._currtx = txid + 1
        del self._slots[txid]
        if opaque:
            self._partitions[txid] = dict(slot.partitions)
        for table in (self._metas, self._partitions):
            for old in [t for t in table if t < txid]:
                del table[old]
        self._failures.pop(txid, None)
        self._attempts.pop(txid, None)
        for done in [t for t in self._digests if t <= txid]:
            del self._digests[done]
        if self.batch_size is not None and latency is not None:
            self.batch_size.on_commit(latency)
        self.stats.committed_txids += 1
        self.stats.records += slot.records
        self.stats.last_committed = txid
        self.stats.outcomes.update(o.value for o in outcomes)
        log.debug("txid committed txid=%d records=%d outcomes=%s", txid, slot.records, outcomes)
        try:
            self._check_fault(FaultPoint.AFTER_ADVANCE, slot.attempt, slot.number)
            self._spout.cleanup_before(txid)
            self._spout.ack(txid, self._public_meta(slot))
        except Exception as exc:  # the txid is committed; hooks are best-effort
            log.warning("post-commit hook failed txid=%d error=%r", txid, exc)
        if self.listener is not None:
            self.listener.on_commit(txid, slot.records)

    def _public_meta(self, slot: _Slot) -> Any:
        return slot.meta if self._kind is SpoutKind.TRANSACTIONAL else dict(slot.partitions)

    # ------------------------------------------------------------------ 5. failure

    def _handle(self, event: _Event) -> None:
        if event.kind == "wakeup":
            return
        if isinstance(event.payload, BaseException) and not isinstance(event.payload, Exception):
            # Not a failure to retry but the process going down (SystemExit, a simulated
            # crash of transactional.testing): end the run at once, as a kill would, even
            # when it comes from a stale attempt. No advance, no hooks, no retry.
            raise event.payload
        slot = self._slots.get(event.attempt.txid)
        if slot is None or slot.attempt != event.attempt:
            self.stats.stale_ignored += 1
            log.debug("stale event ignored kind=%s attempt=%s", event.kind, event.attempt)
            return
        if event.kind == "processed":
            self._processed(slot, event.payload)
        elif event.kind == "committed":
            try:
                self._advance(slot, event.payload)
            except LostLeadershipError:
                raise
            except CoordinatorError as exc:
                self._fail(slot.txid, exc, "advance")
        elif isinstance(event.payload, LostLeadershipError):
            raise event.payload  # step 7 (a fenced sink, a leadership check): not a failure
        else:
            self._fail(slot.txid, event.payload, event.kind.split("_")[0])

    def _processed(self, slot: _Slot, result: _Processed) -> None:
        """A worker finished an attempt: check its batch against the first emit's digest,
        retract it if empty, else it waits to commit (step 3)."""
        txid = slot.txid
        if result.digests is not None:
            try:
                self._check_digest(slot, result.digests)
            except LostLeadershipError:
                raise
            except TransactionalError as exc:
                self._fail(txid, exc, "process")
                return
        if result.records == 0 and not self._spout.commit_empty_batches:
            self._retract(slot)
            return
        self._poll_interval = self.config.poll_interval_s  # data flows: poll at the base rate
        slot.records, slot.prepared = result.records, result.prepared
        slot.state = "processed"
        slot.processed_at = self.clock()
        slot.deadline = None

    def _check_digest(self, slot: _Slot, digests: dict[int, Digest]) -> None:
        """Step 2's determinism check: the first emit of a txid stores what it held; a
        replay must hold the same, or sinks would mix two versions of one batch."""
        txid = slot.txid
        now = {str(p): [n, h] for p, (n, h) in sorted(digests.items())}
        first = self._digests.get(txid)
        if first is None:
            self.store.record_digest(txid, now)
            self._digests[txid] = now
            return
        changed = sorted(
            (int(p) for p in set(first) | set(now) if first.get(p) != now.get(p)), key=int
        )
        if not changed:
            return
        lines = []
        for p in changed:
            before, after = first.get(str(p), [0, "0"]), now.get(str(p), [0, "0"])
            where = "" if self._kind is SpoutKind.TRANSACTIONAL else f"partition {p}: "
            lines.append(
                f"{where}first emit {before[0]} records (checksum {before[1]}), this replay "
                f"{after[0]} records (checksum {after[1]})"
            )
        raise NondeterministicSpoutError(
            f"{self._spout_name} is not deterministic: the replay of txid {txid} "
            f"(metadata {self._stored_meta(txid)!r}) differs from its first emit; "
            + "; ".join(lines)
            + ". Nothing of this replay reached a sink. Make emit_* return the same records "
            "for the same metadata, or, if the source cannot, make it an "
            "OpaquePartitionedTransactionalSpout with opaque-mode committers. (The check "
            "can be switched off with RunnerConfig(check_determinism=False).)"
        )

    def _retract(self, slot: _Slot) -> None:
        """An empty batch is not committed: no sink write, no Delta version, no txid per
        idle poll. Its txid, and every one started after it, is forgotten by the store
        and decided again at the next poll, which backs off while the source stays idle."""
        txid = slot.txid
        decision: Any
        if self._kind is SpoutKind.TRANSACTIONAL:
            decision = dump_meta(slot.meta)
        else:
            decision = {p: dump_meta(m) for p, m in slot.partitions.items()}
        try:
            self.store.retract(txid)
        except LostLeadershipError:
            raise
        except CoordinatorError as exc:  # still stored: the txid replays, empty again
            self._fail(txid, exc, "retract")
            return
        self._drop_from(txid, failed=False)
        for table in (self._metas, self._partitions, self._digests):
            for gone in [t for t in table if t >= txid]:
                del table[gone]
        for gone in [t for t in self._attempts if t >= txid]:
            del self._attempts[gone]
        self._first_started.pop(txid, None)
        self._store_times.pop(txid, None)
        self._next_txid = txid
        self._idle = (txid, decision)
        self.stats.empty_polls += 1
        log.debug("empty batch retracted txid=%d", txid)
        self._idle_poll(self.clock())

    def _fail(self, txid: int, exc: BaseException, phase: str) -> None:
        self._failures[txid] += 1
        failures = self._failures[txid]
        self.stats.failures += 1
        if self.batch_size is not None:
            self.batch_size.on_failure()
        log.warning(
            "txid failed txid=%d phase=%s failures=%d error=%s: %s",
            txid,
            phase,
            failures,
            type(exc).__name__,
            exc,
        )
        self._drop_from(txid)
        self._next_txid = min(self._next_txid, txid)
        self._not_ready = False
        if isinstance(exc, ConfigurationError):  # the same on every attempt: never retried
            raise BatchConfigurationError(txid, self._stored_meta(txid), exc, phase) from exc
        if failures >= self.config.max_attempts:
            raise PoisonBatchError(txid, self._stored_meta(txid), exc, failures) from exc
        self._retry_at = self.clock() + self.config.backoff(failures)

    def _drop_from(self, txid: int, failed: bool = True) -> None:
        """Drop ``txid`` and every in-flight txid above it: cancel their Spark jobs and
        tell the spout they failed (step 5; step 7 drops them all; an empty batch drops
        them without a failure)."""
        for t in sorted(t for t in self._slots if t >= txid):
            slot = self._slots.pop(t)
            self._cancel(slot)
            if self._committing is slot:
                self._committing = None
            if failed:
                meta = self._public_meta(slot)
                _quietly(functools.partial(self._spout.fail, t, meta), "spout fail")

    def _stored_meta(self, txid: int) -> Any:
        meta = self._metas.get(txid)
        if txid in self._partitions:
            meta = {"meta": meta, "partitions": self._partitions[txid]}
        return meta

    def _check_timeouts(self) -> None:
        now = self.clock()
        for slot in sorted(self._slots.values(), key=lambda s: s.txid):
            if slot.deadline is not None and now >= slot.deadline:
                phase = "commit" if slot.state == "committing" else "process"
                self._fail(
                    slot.txid,
                    AttemptTimeoutError(
                        f"txid {slot.txid} attempt {slot.attempt.attempt_id} exceeded "
                        f"{self.config.attempt_timeout_s}s in {phase}; its Spark jobs were cancelled"
                    ),
                    phase,
                )
                return

    def _cancel(self, slot: _Slot) -> None:
        _quietly(lambda: self.engine.cancel(slot.group), "cancel job group")

    def _check_fault(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        if self.faults is not None:
            self.faults.check(point, attempt, number)

    # ------------------------------------------------------------------ waiting

    def _drained(self) -> bool:
        return (
            self._not_ready
            and not self._slots
            and self._next_txid == self._currtx
            and self.clock() >= self._retry_at
        )

    def _wait_time(self) -> float:
        now = self.clock()
        deadlines = [s.deadline for s in self._slots.values() if s.deadline is not None]
        if self._retry_at > now:
            deadlines.append(self._retry_at)
        if self._not_ready or self._poll_at > now:  # a failure clears _not_ready, not the poll
            deadlines.append(self._poll_at)
        room = self._next_txid < self._currtx + self.config.max_pending
        if room and not self._not_ready and self._retry_at <= now and self._poll_at <= now:
            deadlines.append(now)  # a start is due now (e.g. a retry without back-off)
        wait = min(deadlines, default=now + 1.0) - now
        return max(0.001, min(wait, 1.0))


def _json_problem(meta: BatchMetadata) -> str | None:
    """What keeps ``meta`` from a faithful JSON round trip, naming the field; None if
    nothing does. One round trip on the way of every new txid; the field-by-field search
    runs only when it failed, to name the culprit."""
    try:
        text = json.dumps(dump_meta(meta), allow_nan=False)
    except (TypeError, ValueError) as exc:  # NaN, bytes that are not UTF-8, ...
        for name in type(meta).model_fields:
            try:
                json.dumps(meta.model_dump(mode="json", include={name}), allow_nan=False)
            except (TypeError, ValueError) as field_exc:
                return f"field {name!r} = {_brief_repr(getattr(meta, name))} ({field_exc})"
        return f"it cannot be written as JSON {_brief_repr(meta)} ({exc})"
    try:
        again = type(meta).model_validate(json.loads(text))
    except (TypeError, ValueError) as exc:
        return f"it does not load back from its JSON {_brief_repr(meta)} ({exc})"
    changed = [n for n in type(meta).model_fields if getattr(again, n) != getattr(meta, n)]
    if changed:
        return f"field(s) {changed} load back from JSON as different values"
    return None


def _brief_repr(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _quietly(fn: Callable[[], Any], what: str) -> None:
    try:
        fn()
    except Exception as exc:
        log.warning("%s failed error=%r", what, exc)
