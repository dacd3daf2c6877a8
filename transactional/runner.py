"""The runner: the transaction state machine of DESIGN.md section 4.

The protocol, as this module runs it (``currtx`` is the next txid to commit):

1. **Start.** While fewer than ``max_pending`` txids are in flight (the window is
   always ``[currtx, currtx + max_pending)``), start the next txid ``t``. If the store
   holds metadata for ``t`` (a replay after a failure or a restart), reuse it as is and
   do not ask ``is_ready``. Otherwise, if ``is_ready``, decide the metadata
   (``initialize_transaction`` / ``emit_partition_batch_new``, exactly once per txid,
   from the metadata of ``t - 1``) and write it to the store *before* anything is
   emitted. Opaque spouts emit here, in txid order, each partition continuing from
   where ``t - 1`` stopped; their partition metadata is stored only at commit.
2. **Process** (worker threads, several txids at once): build the batch, materialise
   it once (so every bolt and committer of this attempt sees the same rows, even
   from a non-deterministic source), run the bolts, and let each committer
   ``prepare`` its inputs. Each attempt runs in its own Spark job group.
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
   ``PoisonBatchError``; the store keeps everything needed to resume. Results and
   commits of a superseded attempt are ignored when they arrive.
6. **Restart**: read ``currtx`` and all stored metadata, replay every started but
   uncommitted txid with its stored metadata, and only then start new ones. The
   committers skip (transactional) or undo and reapply (opaque) what they had applied.
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from transactional.bolt import DEFAULT_STREAM
from transactional.committer import CommitterContext
from transactional.config import RunnerConfig
from transactional.engine import Engine, SparkEngine
from transactional.errors import (
    AttemptTimeoutError,
    CoordinatorError,
    EmitError,
    LostLeadershipError,
    PoisonBatchError,
    TransactionalError,
)
from transactional.faults import FaultPlan, FaultPoint
from transactional.spout import SpoutContext
from transactional.store import StateStore, TopologyIdentity
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
    deadline: float | None = None

    @property
    def txid(self) -> int:
        return self.attempt.txid

    @property
    def group(self) -> str:
        return f"txid-{self.attempt.txid}-attempt-{self.attempt.attempt_id}"


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
        self.clock = clock
        self.stats = RunStats()
        self._spout = topology.spout
        self._kind = topology.kind
        self._events: queue.Queue[_Event] = queue.Queue()
        self._stop = threading.Event()
        self._attempt_ids = itertools.count(1)
        self._slots: dict[int, _Slot] = {}
        self._failures: Counter[int] = Counter()
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
                self._start_transactions()
                if until_drained and self._drained():
                    break
                self._maybe_commit()
                self._check_timeouts()
                try:
                    event = self._events.get(timeout=self._wait_time())
                except queue.Empty:
                    continue
                self._handle(event)
        finally:
            self._close()
        return self.stats

    def _open(self) -> None:
        cfg = self.config
        self.store.open(cfg.topology_id)
        self.store.register(TopologyIdentity(self._spout.identity(), self._kind.value))
        self.store.acquire_leadership(cfg.leader_timeout_s)
        state = self.store.read_state()
        self._currtx = self._next_txid = state.currtx
        meta_type = self._spout.metadata_type
        for txid, value in state.metas.items():
            self._metas[txid] = (
                meta_type.model_validate(value) if self._kind is SpoutKind.TRANSACTIONAL else value
            )
        for txid, parts in state.partitions.items():
            self._partitions[txid] = {int(p): meta_type.model_validate(v) for p, v in parts.items()}
        replays = sorted(t for t in self._metas if t >= self._currtx)
        log.info(
            "runner started topology=%s currtx=%d replays=%s max_pending=%d",
            cfg.topology_id,
            self._currtx,
            replays,
            cfg.max_pending,
        )
        self._spout.open(SpoutContext(self.engine.spark, cfg.topology_id))
        for node in self.topology.committers:
            node.committer.open(CommitterContext(self.engine.spark, cfg.topology_id, node.name))
        self._workers = ThreadPoolExecutor(cfg.max_pending, thread_name_prefix="txn-process")
        self._committer_thread = ThreadPoolExecutor(1, thread_name_prefix="txn-commit")

    def _close(self) -> None:
        for slot in self._slots.values():
            self._cancel(slot)
        for pool in (self._workers, self._committer_thread):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        for node in self.topology.committers:
            _quietly(node.committer.close, "committer close")
        _quietly(self._spout.close, "spout close")
        _quietly(self.store.close, "store close")

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
                self._not_ready = True
                self._poll_at = now + self.config.poll_interval_s
                return
            self._not_ready = False
            self._next_txid += 1

    def _start(self, txid: int, replay: bool) -> bool:
        spout: Any = self._spout
        attempt = TransactionAttempt(txid, next(self._attempt_ids))
        number = self._failures[txid] + 1
        partitions: dict[int, BatchMetadata] = {}
        frames: dict[int, Any] = {}
        if self._kind is SpoutKind.TRANSACTIONAL:
            if not replay:
                prev = self._metas.get(txid - 1)
                if not spout.is_ready(txid, prev):
                    return False
                meta = spout.initialize_transaction(txid, prev)
                self._check_meta(meta, "initialize_transaction")
                self.store.start_transaction(txid, dump_meta(meta), {})
                self._metas[txid] = meta
            meta = self._metas[txid]
        elif self._kind is SpoutKind.PARTITIONED:
            if not replay:
                last = self._partitions.get(txid - 1, {})
                count = spout.num_partitions()
                if count <= 0 or not spout.is_ready(txid, last):
                    return False
                for p in range(count):
                    partitions[p] = spout.emit_partition_batch_new(attempt, p, last.get(p))
                    self._check_meta(partitions[p], "emit_partition_batch_new")
                record = {"partitions": count}
                self.store.start_transaction(
                    txid, record, {p: dump_meta(m) for p, m in partitions.items()}
                )
                self._metas[txid], self._partitions[txid] = record, partitions
            meta, partitions = self._metas[txid], self._partitions[txid]
        else:
            last = self._emitted_before(txid)
            if not replay:
                count = spout.num_partitions()
                if count <= 0 or not spout.is_ready(txid, last):
                    return False
                record = {"partitions": count}
                self.store.start_transaction(txid, record, {})
                self._metas[txid] = record
            meta = self._metas[txid]
            self._check_fault(FaultPoint.AFTER_STORE_META, attempt, number)
            self._check_fault(FaultPoint.EMIT, attempt, number)
            for p in range(int(meta["partitions"])):
                emitted, frame = spout.emit_partition_batch(attempt, p, last.get(p))
                self._check_meta(emitted, "emit_partition_batch")
                partitions[p], frames[p] = emitted, frame
        slot = _Slot(attempt, number, meta, partitions, frames, started=self.clock())
        if self.config.attempt_timeout_s is not None:
            slot.deadline = slot.started + self.config.attempt_timeout_s
        self._slots[txid] = slot
        log.debug("txid started txid=%d attempt=%s replay=%s", txid, attempt, replay)
        assert self._workers is not None
        self._workers.submit(self._process, slot)
        return True

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
        expected = self._spout.metadata_type
        if not isinstance(meta, expected):
            raise EmitError(
                f"{type(self._spout).__name__}.{method} returned {type(meta).__name__}, "
                f"not its metadata_type {expected.__name__}"
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

    def _build_and_prepare(self, slot: _Slot) -> tuple[int, list[Any]]:
        spout: Any = self._spout
        attempt = slot.attempt
        if self._kind is not SpoutKind.OPAQUE:
            self._check_fault(FaultPoint.AFTER_STORE_META, attempt, slot.number)
            self._check_fault(FaultPoint.EMIT, attempt, slot.number)
        if self._kind is SpoutKind.TRANSACTIONAL:
            frames = [spout.emit_batch(attempt, slot.meta)]
        elif self._kind is SpoutKind.PARTITIONED:
            frames = [
                spout.emit_partition_batch(attempt, p, slot.partitions[p])
                for p in range(int(slot.meta["partitions"]))
            ]
        else:
            frames = [slot.frames[p] for p in sorted(slot.frames)]
        for frame in frames:
            if not self.engine.is_frame(frame):
                raise EmitError(
                    f"{type(spout).__name__} emitted a {type(frame).__name__} for txid "
                    f"{attempt.txid}, not a DataFrame"
                )
        batch = self.engine.materialise(self.engine.union(frames))
        records = self.engine.count(batch)
        streams: dict[tuple[str, str], Any] = {(SPOUT, DEFAULT_STREAM): batch}
        for node in self.topology.bolts:
            out = node.bolt.process(attempt, streams[node.input])
            if not isinstance(out, Mapping):
                out = {DEFAULT_STREAM: out} if len(node.bolt.outputs) == 1 else out
            if not isinstance(out, Mapping) or set(out) != set(node.bolt.outputs):
                raise EmitError(
                    f"bolt {node.name!r} returned streams "
                    f"{sorted(out) if isinstance(out, Mapping) else type(out).__name__}, "
                    f"but declares {list(node.bolt.outputs)}"
                )
            out = node.bolt.finish_batch(attempt, out)
            for stream in node.bolt.outputs:
                streams[(node.name, stream)] = out[stream]
        self._check_fault(FaultPoint.PROCESS, attempt, slot.number)
        prepared = [
            node.committer.prepare(attempt, {k: streams[ref] for k, ref in node.inputs.items()})
            for node in self.topology.committers
        ]
        return records, prepared

    # ------------------------------------------------------------------ 3. commit

    def _maybe_commit(self) -> None:
        slot = self._slots.get(self._currtx)
        if slot is None or slot.state != "processed" or self._committing is not None:
            return
        self.store.check_leadership()  # a runner that lost leadership must not commit
        slot.state = "committing"
        slot.started = self.clock()
        if self.config.attempt_timeout_s is not None:
            slot.deadline = slot.started + self.config.attempt_timeout_s
        self._committing = slot
        assert self._committer_thread is not None
        self._committer_thread.submit(self._commit, slot)

    def _commit(self, slot: _Slot) -> None:
        attempt = slot.attempt
        try:
            outcomes = []
            with self.engine.job_group(slot.group):
                for i, (node, prepared) in enumerate(
                    zip(self.topology.committers, slot.prepared, strict=True)
                ):
                    point = (
                        FaultPoint.BEFORE_SINK_WRITE if i == 0 else FaultPoint.BETWEEN_COMMITTERS
                    )
                    self._check_fault(point, attempt, slot.number)
                    outcomes.append(node.committer.commit(attempt, prepared))
                self._check_fault(FaultPoint.AFTER_SINK_WRITE, attempt, slot.number)
            self._events.put(_Event("committed", attempt, outcomes))
        except BaseException as exc:
            self._events.put(_Event("commit_failed", attempt, exc))

    # ------------------------------------------------------------------ 4. advance

    def _advance(self, slot: _Slot, outcomes: list[CommitOutcome]) -> None:
        txid = slot.txid
        opaque = self._kind is SpoutKind.OPAQUE
        stored = {p: dump_meta(m) for p, m in slot.partitions.items()} if opaque else None
        self.store.advance(txid, stored)
        self._committing = None
        self._currtx = txid + 1
        del self._slots[txid]
        if opaque:
            self._partitions[txid] = dict(slot.partitions)
        for table in (self._metas, self._partitions):
            for old in [t for t in table if t < txid]:
                del table[old]
        self._failures.pop(txid, None)
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
        slot = self._slots.get(event.attempt.txid)
        if slot is None or slot.attempt != event.attempt:
            self.stats.stale_ignored += 1
            log.debug("stale event ignored kind=%s attempt=%s", event.kind, event.attempt)
            return
        if event.kind == "processed":
            slot.records, slot.prepared = event.payload
            slot.state = "processed"
            slot.deadline = None
        elif event.kind == "committed":
            try:
                self._advance(slot, event.payload)
            except LostLeadershipError:
                raise
            except CoordinatorError as exc:
                self._fail(slot.txid, exc, "advance")
        else:
            self._fail(slot.txid, event.payload, event.kind.split("_")[0])

    def _fail(self, txid: int, exc: BaseException, phase: str) -> None:
        self._failures[txid] += 1
        failures = self._failures[txid]
        self.stats.failures += 1
        log.warning(
            "txid failed txid=%d phase=%s failures=%d error=%s: %s",
            txid,
            phase,
            failures,
            type(exc).__name__,
            exc,
        )
        for t in sorted(t for t in self._slots if t >= txid):
            slot = self._slots.pop(t)
            self._cancel(slot)
            if self._committing is slot:
                self._committing = None
            meta = self._public_meta(slot)
            _quietly(functools.partial(self._spout.fail, t, meta), "spout fail")
        self._next_txid = min(self._next_txid, txid)
        self._not_ready = False
        if failures >= self.config.max_attempts:
            meta = self._metas.get(txid)
            if txid in self._partitions:
                meta = {"meta": meta, "partitions": self._partitions[txid]}
            raise PoisonBatchError(txid, meta, exc, failures) from exc
        self._retry_at = self.clock() + self.config.backoff(failures)

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
        if self._not_ready:
            deadlines.append(self._poll_at)
        wait = min(deadlines, default=now + 1.0) - now
        return max(0.001, min(wait, 1.0))


def _quietly(fn: Callable[[], Any], what: str) -> None:
    try:
        fn()
    except Exception as exc:
        log.warning("%s failed error=%r", what, exc)
