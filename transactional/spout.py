"""The three spout kinds of Storm's transactional topologies, over Spark DataFrames.

Each is one class holding both roles Storm splits in two: the *coordinator* part
(``is_ready``, ``initialize_transaction`` / ``num_partitions``) runs on the
driver and decides metadata; the *emitter* part (``emit_*``) turns metadata into
a lazy DataFrame, whose reading happens in Spark tasks.

Contracts that hold for all kinds:

- the runner calls the coordinator methods from one thread, in txid order;
- ``emit_*`` may be called from several threads at once (one per in-flight txid);
- ``ack``/``fail``/``cleanup_before`` are hooks, called from the runner's thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic

from transactional.types import Guarantee, M, SpoutKind, TransactionAttempt

#: The column of ``emit_partitions``'s frame that holds each row's partition number.
PARTITION_COLUMN = "__transactional_partition"

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from transactional.flow import AdaptiveBatchSize
    from transactional.lineage import Dataset


class SpoutContext:
    """What a spout gets at ``open``: the session, the topology's identity, when the
    runner manages batch sizes (``--batch-size auto``) the size to give a new txid, and
    the position a new topology starts from when the run was given one (``--start-from``:
    only for a spout whose ``accepts_start_from`` is True, and only on a topology id
    with no state yet)."""

    def __init__(
        self,
        spark: SparkSession,
        topology_id: str,
        batch_size: AdaptiveBatchSize | int | None = None,
        start_from: str | None = None,
    ) -> None:
        self.spark = spark
        self.topology_id = topology_id
        self.start_from = start_from
        self.adaptive_batch_size = None if isinstance(batch_size, int) else batch_size
        self.fixed_batch_size = batch_size if isinstance(batch_size, int) else None
        #: What ``batch_size`` last answered (None: not asked yet): the run's report
        #: shows it, the spout's own size included.
        self.last_batch_size: int | None = None

    def batch_size(self, default: int) -> int:
        """Records for the next new txid: the adaptive size if the runner has one, else the
        size the run was given (``--batch-size N``), else ``default`` (the spout's own).
        Replays never ask: their metadata is fixed."""
        if self.adaptive_batch_size is not None:
            size = self.adaptive_batch_size.current
        else:
            size = self.fixed_batch_size if self.fixed_batch_size is not None else default
        self.last_batch_size = size
        return size


class _SpoutBase(ABC, Generic[M]):
    kind: ClassVar[SpoutKind]
    #: The pydantic model of this spout's metadata; used to read it back from the store.
    metadata_type: type[M]
    #: A batch that turns out to hold no records is not committed: the runner forgets
    #: its txid and decides it again, from the same previous metadata, at a later poll
    #: (an idle source leaves no txid, no metadata and no sink write behind). Set True
    #: for a source whose ranges can hold no records and still be needed to move on (a
    #: fixed-size range of a compacted log, say): its empty batches then commit.
    commit_empty_batches: ClassVar[bool] = False
    #: The spout reads ``SpoutContext.start_from`` at ``open`` (``--start-from``): where a
    #: new topology starts in the source. A run given a start for a spout that does not
    #: is refused, rather than starting where the spout would anyway.
    accepts_start_from: ClassVar[bool] = False
    #: The guarantees this spout can give (``RunnerConfig.guarantee``;
    #: ``transactional.guarantees``): all, since every kind replays a stored batch. A
    #: spout that cannot replay one says ``frozenset({Guarantee.AT_MOST_ONCE})``.
    guarantees: ClassVar[frozenset[Guarantee]] = frozenset(Guarantee)
    #: Columns of the emitted rows that together say where each record sits in the
    #: source (Kafka: partition and offset), unique within a txid and the same on every
    #: read: each record's ledger id is their hash (``transactional.ledger``), stable
    #: even when a replay reads the batch in other Spark partitions. Empty: the id comes
    #: from the txid and the row's place in the emitted frames.
    position_columns: ClassVar[tuple[str, ...]] = ()
    #: The name the store keeps for this spout's class (``identity``). By default where
    #: the class is defined (``module.Qualname``), taken when the class is made; set it
    #: to a name of your own to keep it when the class moves (or to the name stored
    #: before a move, to go on with the topologies that hold it).
    stored_name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "stored_name" not in cls.__dict__:
            cls.stored_name = f"{cls.__module__}.{cls.__qualname__}"

    def spark_conf(self) -> Mapping[str, str]:
        """Spark settings this spout needs on the runner's session (the jars of Spark's
        Kafka reader, say). ``transactional run`` merges them with the committers'
        (``transactional.spark.session.merged``); user settings (``--conf``) win."""
        return {}

    def lag(self) -> int | None:
        """How far the source is ahead of the last txid decided, in the source's own
        unit (Kafka: offsets), as the spout last saw it; None if it cannot tell. Read by
        progress displays from any thread: it must not do I/O."""
        return None

    def preflight(self) -> None:
        """Check, within a few seconds and changing nothing, that the source can be
        reached (a broker answers, a topic exists), before Spark starts; raise
        ``ConfigurationError`` naming what to fix. It may be called before ``open``, on
        a spout that is then opened as usual. Default: nothing to check."""

    def open(self, context: SpoutContext) -> None:
        """Called once before any other method (but ``preflight``)."""

    def close(self) -> None:
        """Called once when the runner stops."""

    def ack(self, txid: int, meta: Any) -> None:
        """The runner is done with ``txid`` for good, and the store has advanced past it:
        it is committed in every committer, or (``at_most_once``) it failed and was
        dropped. It is never emitted again: a source may forget its records (a queue's
        acknowledgement)."""

    def fail(self, txid: int, meta: Any) -> None:
        """An attempt of ``txid`` failed. Under ``exactly_once`` and ``at_least_once`` it
        will be emitted again with the same metadata (transactional kinds) or from the
        last committed metadata (opaque); under ``at_most_once`` it is dropped, and
        ``ack`` follows once the store has moved past it."""

    def cleanup_before(self, txid: int) -> None:
        """Every txid below ``txid`` is committed; state kept for them may be dropped."""

    def sample_batch(self) -> DataFrame | None:
        """A few records read as ``emit`` reads them (the same reader, the same schema),
        for the runner's warm-up before its first txid (``RunnerConfig.warm_up``): the
        bolts and every committer's ``prepare`` run on it once and nothing is committed,
        so the first txids do not pay the session's cold start (Python workers, code
        generation), and a broken contract stops the run before any txid is stored.
        Records already committed are fine: a sample is never committed. Default None:
        no warm-up. Called on the driver after ``open``."""
        return None

    def locate(
        self, txid: int, meta: Any, records: Sequence[Mapping[str, Any]]
    ) -> Sequence[str | None] | None:
        """Where each of ``records`` sits in the source, in the source's words (``file
        part-1.jsonl line 7``), for a spout without ``position_columns``: the ledger
        names by it the records a bolt lost or multiplied (``LedgerError``). Called on
        the driver only once a txid's ledger check has failed, never on the way of a txid
        that balances, so it may read the source again. ``meta`` is what ``ack`` and
        ``fail`` are given for ``txid`` (None for the warm-up's txid 0, whose records are
        the last ``sample_batch``'s); ``records``, a few rows of the batch, as emitted.
        Must return a text per record, in their order (None: not found), naming every
        place a record may be when its values are found at several. An error or another
        answer is logged and the records are named by their values, as they are by
        default (None)."""
        return None

    def identity(self) -> str:
        """A stable name stored with the topology's state, so that a different spout
        started on the same topology id is refused instead of misreading the metadata.
        Default: ``stored_name``."""
        return self.stored_name

    def lineage_datasets(self) -> Sequence[Dataset]:
        """What this spout reads, as OpenLineage names datasets
        (``transactional.lineage``), for the run events ``RunnerConfig.lineage`` sends.
        Default: none named."""
        return ()


class TransactionalSpout(_SpoutBase[M]):
    """Storm's ``ITransactionalSpout``: one stream of batches, each fixed by its metadata."""

    kind = SpoutKind.TRANSACTIONAL

    def is_ready(self, txid: int, prev_meta: M | None) -> bool:
        """May a *new* txid start now? Never asked for replays.

        ``prev_meta`` is the metadata of ``txid - 1`` (None for the first txid), so a
        stateless spout can tell whether data exists past it. Returning False with
        nothing in flight means "drained" to a runner asked to stop when drained.
        """
        return True

    @abstractmethod
    def initialize_transaction(self, txid: int, prev_meta: M | None) -> M:
        """Decide the metadata of a new txid from the previous one.

        Called once per txid, on the driver, before anything is emitted for it; the
        result is stored before emission and never changes afterwards. (Called again for
        the same txid only when its batch held no records and was not committed: see
        ``commit_empty_batches``.)
        """

    @abstractmethod
    def emit_batch(self, attempt: TransactionAttempt, meta: M) -> DataFrame:
        """Build the batch that ``meta`` describes.

        Must return the same records for the same metadata every time it is called
        (first run and every replay): that is what makes a replay exact.
        """


class PartitionedTransactionalSpout(_SpoutBase[M]):
    """Storm's ``IPartitionedTransactionalSpout``: a fixed set of partitions per txid,
    each with its own metadata, each replayable exactly."""

    kind = SpoutKind.PARTITIONED

    @abstractmethod
    def num_partitions(self) -> int:
        """How many partitions exist now. Recorded per txid: a replay never reads a
        partition that was added after the txid started."""

    def is_ready(self, txid: int, last_metas: Mapping[int, M]) -> bool:
        """May a *new* txid start now? Never asked for replays. ``last_metas`` holds each
        partition's metadata as of ``txid - 1`` (missing for partitions never read)."""
        return True

    @abstractmethod
    def emit_partition_batch_new(
        self, attempt: TransactionAttempt, partition: int, last_meta: M | None
    ) -> M:
        """Decide the next range of ``partition`` after ``last_meta`` (None at first).

        Called on the driver once per partition of a new txid; the result is stored
        before emission. An empty range is fine; a txid whose partitions all hold no
        records is not committed (see ``commit_empty_batches``).
        """

    @abstractmethod
    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, meta: M
    ) -> DataFrame:
        """Build the records of ``partition`` that ``meta`` describes.

        Must return the same records for the same metadata every time. The frames of
        all partitions are unioned, so their reads run in parallel Spark tasks.
        """

    def emit_partitions(self, attempt: TransactionAttempt, metas: Mapping[int, M]) -> Any:
        """Optional: the records of every partition ``metas`` describes (every
        partition of the txid, numbered from 0), as one frame with each row's partition
        number in column ``PARTITION_COLUMN`` (an integer), and otherwise exactly the
        rows and columns of ``emit_partition_batch`` for each. One frame lets a source
        read several partitions in one Spark task: the per-partition frames cost a
        Python evaluation each when they read through ``mapInArrow`` (8 partitions of
        15,625 tweets: 0.8 to 1.1 s as 8 frames, 0.3 to 0.5 s as one frame in 2 tasks).
        The runner drops the column before the bolts see the batch; the determinism
        check is the same either way. Default None: ``emit_partition_batch`` per
        partition."""
        return None


class OpaquePartitionedTransactionalSpout(_SpoutBase[M]):
    """Storm's ``IOpaquePartitionedTransactionalSpout``: a replay may produce a different
    batch (the source lost or reordered data). Only opaque committers accept it."""

    kind = SpoutKind.OPAQUE

    @abstractmethod
    def num_partitions(self) -> int:
        """How many partitions exist now."""

    def is_ready(self, txid: int, last_metas: Mapping[int, M]) -> bool:
        """May a *new* txid start now? ``last_metas`` are the metadata the partitions
        reached with ``txid - 1`` (emitted, not necessarily committed)."""
        return True

    @abstractmethod
    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, last_meta: M | None
    ) -> tuple[M, DataFrame]:
        """Emit the next batch of ``partition`` after ``last_meta`` and say what it was.

        ``last_meta`` is the metadata the previous txid reached on this partition; after
        a failure it is the last *committed* metadata. The returned metadata is stored
        only when the txid commits.
        """


AnySpout = (
    TransactionalSpout[Any]
    | PartitionedTransactionalSpout[Any]
    | OpaquePartitionedTransactionalSpout[Any]
)
