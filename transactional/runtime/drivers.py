"""One driver per spout kind, behind one interface: what a new batch is, how it is
replayed, what is stored, and how a spout is told what became of its txids.

The state machine knows txids and attempts only; everything that depends on the spout
kind (docs/design.md section 5) lives here, and nowhere else:

- **transactional**: ``is_ready`` and ``initialize_transaction`` decide a txid's
  metadata from the previous one's, stored before anything is emitted; a worker emits
  ``emit_batch(attempt, meta)``, first time and replay alike.
- **partitioned**: ``num_partitions`` and ``emit_partition_batch_new`` decide each
  partition's metadata, all stored with the txid's partition count before anything is
  emitted; a worker emits ``emit_partition_batch`` per partition.
- **opaque**: only the partition count is stored at start; the batch is emitted on the
  coordinator thread (``emit_partition_batch`` decides and emits at once), each
  partition continuing where the txid before it stopped, and its partition metadata is
  stored only when it commits. A replay starts from the last committed metadata.

A driver mirrors the stored metadata of its topology (the store stays the truth on
restart) and keeps the current batch of each in-flight txid.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from transactional import contracts
from transactional.faults import FaultPoint
from transactional.runtime.determinism import FirstEmits
from transactional.spark.engine import Digest, Engine
from transactional.store import StateStore, StoredState
from transactional.types import BatchMetadata, Guarantee, SpoutKind, TransactionAttempt, dump_meta

#: ``(point, attempt, number)``: a fault-injection point reached (``probes.Faults``).
Checkpoint = Callable[[FaultPoint, TransactionAttempt, int], None]


@dataclass
class Batch:
    """One attempt of one txid, as its driver built it."""

    attempt: TransactionAttempt
    number: int
    #: Coordinator metadata (transactional) or the partition count record.
    meta: Any
    #: Partitioned: as stored; opaque: as emitted by this attempt.
    partitions: dict[int, BatchMetadata] = field(default_factory=dict)
    #: Opaque: the frames emitted on the coordinator thread.
    frames: dict[int, Any] = field(default_factory=dict)
    #: Seconds the store took to record a new txid's metadata (0 for a replay).
    store_s: float = 0.0

    @property
    def txid(self) -> int:
        return self.attempt.txid


def job_group(attempt: TransactionAttempt, run: str) -> str:
    """The Spark job group of an attempt of the run ``run``: its jobs are cancelled with
    it, and counted (a name of its own per run: Spark remembers finished groups)."""
    return f"txid-{attempt.txid}-attempt-{attempt.attempt_id}-run-{run}"


class SpoutDriver(ABC):
    """Runs one spout for the runner. ``new_batch``/``replay``/``verify``/``retract``/
    ``advance`` run on the coordinator thread, ``frames`` in a worker."""

    kind: ClassVar[SpoutKind]
    #: Whether a replay must equal its first emit (the determinism check applies).
    replays_exactly: ClassVar[bool] = True

    def __init__(
        self,
        spout: Any,
        name: str,
        store: StateStore,
        engine: Engine,
        checkpoint: Checkpoint,
        check_determinism: bool,
        guarantee: Guarantee = Guarantee.EXACTLY_ONCE,
    ) -> None:
        self.spout, self.name, self.store = spout, name, store
        self.engine, self.checkpoint = engine, checkpoint
        self.guarantee = guarantee
        # A replay that differs is only a breach where the run promises exactly once.
        self.digests = (
            check_determinism and self.replays_exactly and guarantee is Guarantee.EXACTLY_ONCE
        )
        self.metas: dict[int, Any] = {}
        self.partitions: dict[int, dict[int, BatchMetadata]] = {}
        self.first_emits = FirstEmits(store, name, self.where)
        self.batches: dict[int, Batch] = {}
        #: (txid, decision) of the last batch found empty and retracted: the same decision
        #: again means the source is still idle, and is neither stored nor emitted.
        self.idle: tuple[int, Any] | None = None

    # ------------------------------------------------------------------ per kind

    @abstractmethod
    def _decide(self, attempt: TransactionAttempt, number: int) -> Batch | None:
        """A new txid: ask the spout; store the metadata; None if there is nothing new."""

    @abstractmethod
    def _rebuild(self, attempt: TransactionAttempt, number: int) -> Batch:
        """A txid again, from its stored metadata."""

    @abstractmethod
    def frames(self, batch: Batch) -> tuple[list[Any], int | None]:
        """The batch's frames, one per partition, and None; or one frame of all
        partitions tagged with ``PARTITION_COLUMN`` (``emit_partitions``), and their
        count (a worker calls this)."""

    @abstractmethod
    def decision(self, batch: Batch) -> Any:
        """What the spout decided for the batch, as stored: equal decisions, equal data."""

    @abstractmethod
    def public_meta(self, batch: Batch) -> Any:
        """What the spout's ``ack`` and ``fail`` hooks are given."""

    # ------------------------------------------------------------------ lifecycle

    def load(self, state: StoredState) -> frozenset[int]:
        """Mirror the stored state; the txids whose metadata is stored."""
        self.metas.clear()
        self.partitions.clear()
        self.batches.clear()
        meta_type = self.spout.metadata_type
        for txid, value in state.metas.items():
            self.metas[txid] = self._load_meta(value)
        for txid, parts in state.partitions.items():
            self.partitions[txid] = {int(p): meta_type.model_validate(v) for p, v in parts.items()}
        self.first_emits.load(state.digests)
        return frozenset(self.metas)

    def _load_meta(self, value: Any) -> Any:
        return value

    def new_batch(self, attempt: TransactionAttempt, number: int) -> Batch | None:
        batch = self._decide(attempt, number)
        if batch is not None:
            self.batches[attempt.txid] = batch
        return batch

    def replay(self, attempt: TransactionAttempt, number: int) -> Batch:
        batch = self._rebuild(attempt, number)
        self.batches[attempt.txid] = batch
        return batch

    def has_stored(self, txid: int) -> bool:
        return txid in self.metas

    def drop(self, txid: int, failed: bool) -> Batch | None:
        """The attempt of ``txid`` was dropped; ``failed``: tell the spout."""
        batch = self.batches.pop(txid, None)
        if batch is not None and failed:
            self.spout.fail(txid, self.public_meta(batch))
        return batch

    def verify(self, batch: Batch, digests: Mapping[int, Digest] | None) -> None:
        """The determinism check (``determinism.FirstEmits``)."""
        if digests is not None:
            self.first_emits.check(batch.txid, digests, self.stored_meta(batch.txid))

    def where(self, partition: int) -> str:
        """A partition as messages name it."""
        return f"partition {partition}: "

    def retract(self, batch: Batch) -> None:
        """An empty batch: its txid and every one above it are forgotten by the store,
        and the decision is remembered as the idle one."""
        txid = batch.txid
        self.store.retract(txid)
        for table in (self.metas, self.partitions, self.batches):
            for gone in [t for t in table if t >= txid]:
                del table[gone]
        self.first_emits.forget_from(txid)
        self.idle = (txid, self.decision(batch))

    def advance(self, batch: Batch, first: int | None = None) -> None:
        """The txid (with every txid from ``first``: a commit group) is committed in
        every sink: the fenced store write, then the mirror."""
        txid = batch.txid
        self.store.advance(txid, self._committed_partitions(batch), first=first)
        for table in (self.metas, self.partitions):
            for old in [t for t in table if t < txid]:
                del table[old]
        self.first_emits.forget_through(txid)

    def _committed_partitions(self, batch: Batch) -> dict[int, Any] | None:
        return None

    def skip(self, txid: int) -> Any:
        """``at_most_once``: the store moves past ``txid`` with no commit (it was dropped,
        or it reached every sink and only the store's advance failed): the fenced store
        write, then the mirror. What the spout's hooks are given for it is returned
        (``acknowledge_skipped``)."""
        public = self._stored_public(txid)
        self.store.advance(txid, self._stored_partitions(txid))
        for table in (self.metas, self.partitions):
            for old in [t for t in table if t < txid]:
                del table[old]
        self.first_emits.forget_through(txid)
        self.batches.pop(txid, None)
        return public

    def acknowledge_skipped(self, txid: int, public: Any) -> None:
        """The spout's hooks for a skipped txid: it is never emitted again."""
        self.spout.cleanup_before(txid)
        self.spout.ack(txid, public)

    def _stored_public(self, txid: int) -> Any:
        """What the spout's hooks are given for ``txid``, from its stored metadata."""
        return dict(self.partitions.get(txid, {}))

    def _stored_partitions(self, txid: int) -> dict[int, Any] | None:
        """The partition metadata a skip of ``txid`` stores as where the next txid starts
        (opaque spouts), else None."""
        return None

    def acknowledge(self, batch: Batch) -> None:
        """The spout's post-commit hooks, once the store has advanced past the txid."""
        self.spout.cleanup_before(batch.txid)
        self.spout.ack(batch.txid, self.public_meta(batch))

    def stored_meta(self, txid: int) -> Any:
        meta = self.metas.get(txid)
        if txid in self.partitions:
            meta = {"meta": meta, "partitions": self.partitions[txid]}
        return meta

    # ------------------------------------------------------------------ helpers

    def _still_idle(self, txid: int, decision: Any) -> bool:
        """The spout decided, for ``txid``, exactly what was found empty last time."""
        return self.idle == (txid, decision)

    def _store(self, txid: int, meta: Any, partitions: Mapping[int, Any]) -> float:
        began = time.perf_counter()
        self.store.start_transaction(txid, meta, partitions)
        return time.perf_counter() - began

    def _check_meta(self, meta: object, method: str) -> None:
        contracts.check_metadata(meta, self.spout.metadata_type, self.name, method)

    def _partition_count(self, txid: int, last: Mapping[int, Any]) -> int | None:
        """A new txid's partition count, or None if the spout is not ready."""
        count = contracts.check_partition_count(self.spout.num_partitions(), self.name)
        if count == 0 or not contracts.check_ready(
            self.spout.is_ready(txid, last), self.name, txid
        ):
            return None
        return count


class TransactionalDriver(SpoutDriver):
    kind = SpoutKind.TRANSACTIONAL

    def _load_meta(self, value: Any) -> Any:
        return self.spout.metadata_type.model_validate(value)

    def _decide(self, attempt: TransactionAttempt, number: int) -> Batch | None:
        txid = attempt.txid
        prev = self.metas.get(txid - 1)
        if not contracts.check_ready(self.spout.is_ready(txid, prev), self.name, txid):
            return None
        meta = self.spout.initialize_transaction(txid, prev)
        self._check_meta(meta, "initialize_transaction")
        if self._still_idle(txid, dump_meta(meta)):
            return None
        stored = self._store(txid, dump_meta(meta), {})
        self.metas[txid] = meta
        return Batch(attempt, number, meta, store_s=stored)

    def _rebuild(self, attempt: TransactionAttempt, number: int) -> Batch:
        return Batch(attempt, number, self.metas[attempt.txid])

    def frames(self, batch: Batch) -> tuple[list[Any], int | None]:
        self.checkpoint(FaultPoint.AFTER_STORE_META, batch.attempt, batch.number)
        self.checkpoint(FaultPoint.EMIT, batch.attempt, batch.number)
        emitted = self.spout.emit_batch(batch.attempt, batch.meta)
        is_frame = self.engine.is_frame
        frame = contracts.check_frame(emitted, is_frame, self.name, "emit_batch", batch.txid)
        return [frame], None

    def decision(self, batch: Batch) -> Any:
        return dump_meta(batch.meta)

    def public_meta(self, batch: Batch) -> Any:
        return batch.meta

    def where(self, partition: int) -> str:
        return ""

    def _stored_public(self, txid: int) -> Any:
        return self.metas.get(txid)


class PartitionedDriver(SpoutDriver):
    kind = SpoutKind.PARTITIONED

    def _decide(self, attempt: TransactionAttempt, number: int) -> Batch | None:
        txid = attempt.txid
        last = self.partitions.get(txid - 1, {})
        count = self._partition_count(txid, last)
        if count is None:
            return None
        partitions: dict[int, BatchMetadata] = {}
        for p in range(count):
            partitions[p] = self.spout.emit_partition_batch_new(attempt, p, last.get(p))
            self._check_meta(partitions[p], "emit_partition_batch_new")
        stored = {p: dump_meta(m) for p, m in partitions.items()}
        if self._still_idle(txid, stored):
            return None
        record = {"partitions": count}
        seconds = self._store(txid, record, stored)
        self.metas[txid], self.partitions[txid] = record, partitions
        return Batch(attempt, number, record, dict(partitions), store_s=seconds)

    def _rebuild(self, attempt: TransactionAttempt, number: int) -> Batch:
        txid = attempt.txid
        return Batch(attempt, number, self.metas[txid], dict(self.partitions[txid]))

    def frames(self, batch: Batch) -> tuple[list[Any], int | None]:
        self.checkpoint(FaultPoint.AFTER_STORE_META, batch.attempt, batch.number)
        self.checkpoint(FaultPoint.EMIT, batch.attempt, batch.number)
        count = int(batch.meta["partitions"])
        metas = {p: batch.partitions[p] for p in range(count)}
        combined = self.spout.emit_partitions(batch.attempt, metas)
        if combined is not None:
            return [
                contracts.check_tagged_frame(
                    combined, self.engine.is_frame, self.name, "emit_partitions", batch.txid
                )
            ], count
        return [
            contracts.check_frame(
                self.spout.emit_partition_batch(batch.attempt, p, batch.partitions[p]),
                self.engine.is_frame,
                self.name,
                f"emit_partition_batch (partition {p})",
                batch.txid,
            )
            for p in range(count)
        ], None

    def decision(self, batch: Batch) -> Any:
        return {p: dump_meta(m) for p, m in batch.partitions.items()}

    def public_meta(self, batch: Batch) -> Any:
        return dict(batch.partitions)


class OpaqueDriver(SpoutDriver):
    kind = SpoutKind.OPAQUE
    replays_exactly = False  # a replay may emit another batch, by definition

    def _decide(self, attempt: TransactionAttempt, number: int) -> Batch | None:
        txid = attempt.txid
        count = self._partition_count(txid, self._emitted_before(txid))
        if count is None:
            return None
        record = {"partitions": count}
        if self.guarantee is Guarantee.AT_MOST_ONCE:
            return self._decide_consumed(attempt, number, record)
        seconds = self._store(txid, record, {})
        self.metas[txid] = record
        self._reached_store(attempt, number)
        batch = self._emit(attempt, number, record)
        batch.store_s = seconds
        # An opaque batch is known only once emitted (lazily: no Spark job yet).
        if self._still_idle(txid, self.decision(batch)):
            self.store.retract(txid)
            del self.metas[txid]
            return None
        return batch

    def _decide_consumed(
        self, attempt: TransactionAttempt, number: int, record: dict[str, int]
    ) -> Batch | None:
        """``at_most_once``: the batch is emitted (lazily) first and stored with what it
        emitted, so the source's position is past it before it is processed: a txid
        dropped, in this run or after a crash, is never emitted again."""
        txid = attempt.txid
        batch = self._emit(attempt, number, record)
        if self._still_idle(txid, self.decision(batch)):
            return None
        batch.store_s = self._store(txid, record, self.decision(batch))
        self.metas[txid], self.partitions[txid] = record, dict(batch.partitions)
        self._reached_store(attempt, number)
        return batch

    def _rebuild(self, attempt: TransactionAttempt, number: int) -> Batch:
        self._reached_store(attempt, number)
        return self._emit(attempt, number, self.metas[attempt.txid])

    def _reached_store(self, attempt: TransactionAttempt, number: int) -> None:
        self.checkpoint(FaultPoint.AFTER_STORE_META, attempt, number)
        self.checkpoint(FaultPoint.EMIT, attempt, number)

    def _emit(self, attempt: TransactionAttempt, number: int, record: Any) -> Batch:
        txid = attempt.txid
        last = self._emitted_before(txid)
        batch = Batch(attempt, number, record)
        for p in range(int(batch.meta["partitions"])):
            batch.partitions[p], batch.frames[p] = contracts.check_opaque_pair(
                self.spout.emit_partition_batch(attempt, p, last.get(p)),
                self.spout.metadata_type,
                self.engine.is_frame,
                self.name,
                txid,
                p,
            )
            self._check_meta(batch.partitions[p], "emit_partition_batch")
        return batch

    def _emitted_before(self, txid: int) -> dict[int, BatchMetadata]:
        """Where each partition stood after ``txid - 1``: emitted by its in-flight
        attempt, or else as last committed."""
        previous = self.batches.get(txid - 1)
        if previous is not None:
            return previous.partitions
        committed: dict[int, BatchMetadata] = {}
        for t in sorted(t for t in self.partitions if t < txid):
            committed.update(self.partitions[t])
        return committed

    def frames(self, batch: Batch) -> tuple[list[Any], int | None]:
        return [batch.frames[p] for p in sorted(batch.frames)], None

    def decision(self, batch: Batch) -> Any:
        return {p: dump_meta(m) for p, m in batch.partitions.items()}

    def public_meta(self, batch: Batch) -> Any:
        return dict(batch.partitions)

    def _committed_partitions(self, batch: Batch) -> dict[int, Any] | None:
        return {p: dump_meta(m) for p, m in batch.partitions.items()}

    def _stored_partitions(self, txid: int) -> dict[int, Any] | None:
        return {p: dump_meta(m) for p, m in self.partitions.get(txid, {}).items()}

    def advance(self, batch: Batch, first: int | None = None) -> None:
        super().advance(batch, first)
        self.partitions[batch.txid] = dict(batch.partitions)  # where the next txid starts


DRIVERS: dict[SpoutKind, type[SpoutDriver]] = {
    d.kind: d for d in (TransactionalDriver, PartitionedDriver, OpaqueDriver)
}
