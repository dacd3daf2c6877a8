"""In-memory doubles for fast unit tests of the state machine.

Frames here are plain Python lists of rows; ``InMemoryEngine`` gives the runner the
few batch operations it needs over them. Integration tests use Spark, real stores and
real sinks instead; these doubles exist so the protocol itself can be tested in
milliseconds, step by step.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from transactional.errors import ContractError, CoordinatorError, FencedError
from transactional.spark.engine import Materialised
from transactional.spout import (
    OpaquePartitionedTransactionalSpout,
    PartitionedTransactionalSpout,
    TransactionalSpout,
)
from transactional.store import StateStore, StoredState, TopologyIdentity
from transactional.types import BatchMetadata, TransactionAttempt

__all__ = [
    "InMemoryEngine",
    "InMemoryStateStore",
    "ListOpaqueSpout",
    "ListPartitionedSpout",
    "ListTransactionalSpout",
    "Range",
    "partitions_have_more",
]


# ---------------------------------------------------------------------- engine


class InMemoryEngine:
    spark: Any = None

    def __init__(self) -> None:
        self._local = threading.local()
        self.cancelled: list[str] = []
        self.groups: list[str] = []
        #: Each job group's txid as ``job_group`` was given it (None: a commit's, the
        #: warm-up's), in the order they began.
        self.group_txids: list[tuple[str, int | None]] = []
        self.descriptions: list[str] = []

    def materialise(
        self,
        frames: Sequence[list[Any]],
        digest: bool,
        partitions: int | None = None,
        ids: Any = None,
        defer: bool = False,
    ) -> Materialised:
        """With ``partitions``: ``frames`` is one list of ``(partition, row)`` pairs (an
        in-memory spout's ``emit_partitions``). ``ids``: never given (its frames are
        lists, which the ledger does not count: ``counts_ids`` is not set). ``defer``:
        ignored, lists are counted at once."""
        if partitions is not None:
            strays = {p for p, _ in frames[0]} - set(range(partitions))
            if strays:
                raise ContractError(f"rows tagged with partition {min(strays)} of {partitions}")
            frames = [[row for p, row in frames[0] if p == n] for n in range(partitions)]
        batch = [row for frame in frames for row in frame]
        if not digest:
            return Materialised(batch, len(batch))
        digests = {p: (len(frame), _checksum(frame)) for p, frame in enumerate(frames)}
        return Materialised(batch, len(batch), digests)

    def revive(self) -> None:
        return None

    @contextmanager
    def job_group(self, group: str, txid: int | None = None) -> Iterator[None]:
        self._local.group = group
        self.groups.append(group)
        self.group_txids.append((group, txid))
        try:
            yield
        finally:
            self._local.group = None

    def describe(self, text: str) -> None:
        self.descriptions.append(text)

    def cancel(self, group: str) -> None:
        self.cancelled.append(group)

    def collect(self, frames: Mapping[Any, list[Any]]) -> dict[Any, list[Any]]:
        return {name: list(rows) for name, rows in frames.items()}

    def jobs(self, group: str) -> int | None:
        return None

    def replan(self, frames: Sequence[Any], was: Any, observed: Sequence[Any] = ()) -> None:
        """None: lists hold rows, not plans; every attempt builds its own."""
        return None

    def mark(self) -> int:
        return 0

    def release(self, frames: Iterable[Any], since: int) -> int:
        """In-memory batches are Python lists: nothing is kept beside them to release."""
        return 0

    def is_frame(self, value: object) -> bool:
        return isinstance(value, list)


def _checksum(rows: Iterable[Any]) -> str:
    """Order-independent, like the Spark engine's: a sum of per-row hashes (stable
    across processes, unlike ``hash``)."""
    total = sum(
        int.from_bytes(hashlib.blake2b(repr(row).encode(), digest_size=8).digest(), "big")
        for row in rows
    )
    return str(total)


# ---------------------------------------------------------------------- store


class InMemoryStateStore(StateStore):
    """A store kept in dicts; survives a runner (pass the same instance to a new one) the
    way a real store survives a process."""

    def __init__(self) -> None:
        self.currtx = 1
        self.metas: dict[int, Any] = {}
        self.partitions: dict[int, dict[int, Any]] = {}
        self.digests: dict[int, Any] = {}
        self.identity: TopologyIdentity | None = None
        self.advances: list[int] = []
        self.starts: list[int] = []
        self.retracted: list[int] = []
        self.group: tuple[int, int] | None = None
        self.groups: list[tuple[int, int]] = []
        self.fail_advance: Callable[[int], bool] = lambda txid: False
        self.leader = False

    def open(self, topology_id: str, read_only: bool = False) -> None:
        self.topology_id = topology_id

    def topology_ids(self) -> list[str]:
        return [] if self.identity is None else [getattr(self, "topology_id", "")]

    def close(self) -> None:
        self.leader = False

    def register(self, identity: TopologyIdentity) -> None:
        if self.identity is None:
            self.identity = identity
        elif self.identity != identity:
            raise CoordinatorError(f"identity {identity} != {self.identity}")

    def acquire_leadership(self, timeout: float | None = None) -> None:
        self.leader = True

    def check_leadership(self) -> None:
        if not self.leader:
            raise FencedError("not the leader")

    def read_state(self) -> StoredState:
        return StoredState(
            self.currtx,
            dict(self.metas),
            {t: dict(p) for t, p in self.partitions.items()},
            dict(self.digests),
            self.group,
        )

    def start_transaction(self, txid: int, meta: Any, partitions: Mapping[int, Any]) -> None:
        if txid in self.metas:
            raise CoordinatorError(f"metadata of txid {txid} already stored")
        self.metas[txid] = meta
        if partitions:
            self.partitions[txid] = dict(partitions)
        self.starts.append(txid)

    def advance(
        self, txid: int, partitions: Mapping[int, Any] | None = None, first: int | None = None
    ) -> None:
        first = txid if first is None else first
        if self.currtx != first:
            raise FencedError(f"currtx is {self.currtx}, not {first}")
        if first != txid and self.group != (first, txid):
            raise CoordinatorError(f"group {first}..{txid} is not the recorded {self.group}")
        if self.fail_advance(txid):
            raise CoordinatorError(f"advance of txid {txid} failed (injected)")
        if partitions is not None:
            self.partitions[txid] = dict(partitions)
        self.currtx = txid + 1
        for table in (self.metas, self.partitions):
            for old in [t for t in table if t < txid]:
                del table[old]
        for old in [t for t in self.digests if t <= txid]:
            del self.digests[old]
        self.advances.append(txid)

    def record_digest(self, txid: int, digest: Any) -> None:
        self.check_leadership()
        if txid not in self.metas or txid in self.digests or txid < self.currtx:
            raise CoordinatorError(f"cannot record a digest for txid {txid}")
        self.digests[txid] = digest

    def record_group(self, first: int, last: int) -> None:
        self.check_leadership()
        started = all(t in self.metas for t in range(first, last + 1))
        if first != self.currtx or not first < last or not started:
            raise CoordinatorError(f"cannot record group {first}..{last}")
        if self.group is not None and self.group[0] == first and self.group != (first, last):
            raise CoordinatorError(f"group from {first} is already {self.group}")
        self.group = (first, last)
        self.groups.append(self.group)

    def retract(self, txid: int) -> None:
        self.check_leadership()
        if txid < self.currtx:
            raise FencedError(f"cannot retract txid {txid}: currtx is {self.currtx}")
        if self.group is not None and self.group[0] == self.currtx and txid <= self.group[1]:
            raise CoordinatorError(f"cannot retract txid {txid} of group {self.group}")
        for table in (self.metas, self.partitions, self.digests):
            for gone in [t for t in table if t >= txid]:
                del table[gone]
        self.retracted.append(txid)


# ---------------------------------------------------------------------- spouts


class Range(BatchMetadata):
    start: int
    count: int

    @property
    def end(self) -> int:
        return self.start + self.count


class ListTransactionalSpout(TransactionalSpout[Range]):
    """Batches of ``batch_size`` over a list that may grow while the runner runs."""

    metadata_type = Range

    def __init__(self, records: list[Any], batch_size: int) -> None:
        self.records = records
        self.batch_size = batch_size
        self.ready_calls: list[int] = []
        self.init_calls: list[tuple[int, Range | None]] = []
        self.emits: list[tuple[TransactionAttempt, Range]] = []
        self.acked: list[int] = []
        self.failed: list[int] = []
        self.cleanups: list[int] = []
        self._lock = threading.Lock()

    def is_ready(self, txid: int, prev_meta: Range | None) -> bool:
        self.ready_calls.append(txid)
        return (prev_meta.end if prev_meta else 0) < len(self.records)

    def initialize_transaction(self, txid: int, prev_meta: Range | None) -> Range:
        self.init_calls.append((txid, prev_meta))
        start = prev_meta.end if prev_meta else 0
        return Range(start=start, count=min(self.batch_size, len(self.records) - start))

    def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> list[Any]:  # type: ignore[override]
        with self._lock:
            self.emits.append((attempt, meta))
        return self.records[meta.start : meta.end]

    def ack(self, txid: int, meta: Any) -> None:
        self.acked.append(txid)

    def fail(self, txid: int, meta: Any) -> None:
        self.failed.append(txid)

    def cleanup_before(self, txid: int) -> None:
        self.cleanups.append(txid)


def partitions_have_more(
    partitions: Sequence[Sequence[Any]], last_metas: Mapping[int, Range]
) -> bool:
    """Does any partition hold records past where ``last_metas`` left it?"""
    return any(
        (last_metas[p].end if p in last_metas else 0) < len(part)
        for p, part in enumerate(partitions)
    )


class ListPartitionedSpout(PartitionedTransactionalSpout[Range]):
    """Each inner list is one partition; a partition appended later is read only by
    txids started after it appeared."""

    metadata_type = Range

    def __init__(self, partitions: list[list[Any]], batch_size: int) -> None:
        self.partitions = partitions
        self.batch_size = batch_size
        self.emits: list[tuple[TransactionAttempt, int, Range]] = []
        self._lock = threading.Lock()

    def num_partitions(self) -> int:
        return len(self.partitions)

    def is_ready(self, txid: int, last_metas: Mapping[int, Range]) -> bool:
        return partitions_have_more(self.partitions, last_metas)

    def emit_partition_batch_new(
        self, attempt: TransactionAttempt, partition: int, last_meta: Range | None
    ) -> Range:
        start = last_meta.end if last_meta else 0
        available = len(self.partitions[partition]) - start
        return Range(start=start, count=max(0, min(self.batch_size, available)))

    def emit_partition_batch(  # type: ignore[override]
        self, attempt: TransactionAttempt, partition: int, meta: Range
    ) -> list[Any]:
        with self._lock:
            self.emits.append((attempt, partition, meta))
        return self.partitions[partition][meta.start : meta.end]


class ListOpaqueSpout(OpaquePartitionedTransactionalSpout[Range]):
    """An opaque source: ``source(attempt, partition, start, n)`` may return different
    records on a replay, as a source that lost or reordered data would."""

    metadata_type = Range

    def __init__(
        self,
        partitions: list[list[Any]],
        batch_size: int,
        source: Callable[[TransactionAttempt, int, list[Any]], list[Any]] | None = None,
    ) -> None:
        self.partitions = partitions
        self.batch_size = batch_size
        self.source = source
        self.emits: list[tuple[TransactionAttempt, int, Range]] = []

    def num_partitions(self) -> int:
        return len(self.partitions)

    def is_ready(self, txid: int, last_metas: Mapping[int, Range]) -> bool:
        return partitions_have_more(self.partitions, last_metas)

    def emit_partition_batch(  # type: ignore[override]
        self, attempt: TransactionAttempt, partition: int, last_meta: Range | None
    ) -> tuple[Range, list[Any]]:
        start = last_meta.end if last_meta else 0
        rows = self.partitions[partition][start : start + self.batch_size]
        meta = Range(start=start, count=len(rows))
        self.emits.append((attempt, partition, meta))
        if self.source is not None:
            rows = self.source(attempt, partition, rows)
        return meta, list(rows)
