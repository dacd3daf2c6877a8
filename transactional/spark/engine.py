"""The few batch operations the runner needs, behind a small protocol, so the state
machine can be unit-tested with in-memory frames and run on Spark in production."""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from transactional._logfmt import kv
from transactional.errors import ContractError
from transactional.ledger import ID, Tally
from transactional.spark._replan import Replan, observation_of
from transactional.spark.checkpoints import KEPT as _KEPT
from transactional.spark.checkpoints import checkpoint
from transactional.spark.columns import prebuilt
from transactional.spark.connect import is_connect, reopen_if_lost
from transactional.spark.ids import RecordIds, check_positions, id_column, id_sums
from transactional.spout import PARTITION_COLUMN

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructField

log = logging.getLogger("transactional.runner")

#: A partition's record count and order-independent content checksum (a decimal string).
Digest = tuple[int, str]


@dataclass(frozen=True)
class Materialised:
    """One attempt's batch, read once: ``batch`` is what the bolts see, ``records`` its
    row count, ``digests`` (when asked for) the digest of each emitted partition,
    ``ids`` (when asked for) the ledger's tally of the records' ids
    (``transactional.ledger``: the batch then holds them in ``ledger.ID``)."""

    batch: Any
    records: int
    digests: dict[int, Digest] | None = None
    ids: Tally | None = None
    #: Not yet counted (``materialise``'s ``defer``): ``records``, ``digests`` and
    #: ``ids`` are known once a job has read the batch (``Pending``), ``batch`` is the
    #: kept relation and the bolts see ``pending.batch``; None: known.
    pending: Pending | None = None


class Pending:
    """A batch whose count, digests and tally the first job that reads it observes:
    the observation sits on the kept batch's relation, in every plan built over the
    batch, so a plan whose job reads the batch in its result stage (the committers'
    collects of a small batch, fused: ``transactional.spark._replan.Fused``) needs no job of
    its own to count it. ``settle`` runs that job where nothing else will.

    The observed batch (``root``, ``batch``) is built when first asked for: an attempt
    whose plans are re-pointed needs the kept relation alone (``kept``)."""

    def __init__(self, read: _Read, engine: SparkEngine) -> None:
        self.spark = engine.spark
        self._read = read
        self._engine = engine
        #: The batch kept (a lazy checkpoint, not yet stored), unobserved.
        self.kept = read.kept
        self._root: DataFrame | None = None
        self._batch: DataFrame | None = None

    @property
    def tasks(self) -> int:
        """The tasks that read it (its relation's partitions): a job of one task that
        reads it reads them one after the other, where ``settle``'s job reads them side
        by side."""
        return int(self.kept._jdf.logicalPlan().rdd().getNumPartitions())

    @property
    def root(self) -> DataFrame:
        """The observed kept batch (its plan's root: the ``CollectMetrics``)."""
        if self._root is None:
            self._root = self.kept.observe(f"read-{uuid.uuid4().hex}", *self._read.metrics())
        return self._root

    @property
    def batch(self) -> DataFrame:
        """What the bolts see: ``root``, coalesced to one task."""
        if self._batch is None:
            self._batch = self._read.unmarked(self.root).coalesce(1)
        return self._batch

    def observation(self) -> Any:
        """The session's ``Observation`` of ``root``, registered now: a query holding
        it completes it (one registered for a plan never run would stay registered)."""
        plan = self.root._jdf.logicalPlan()
        return observation_of(self.spark, str(plan.name()), int(plan.dataframeId()))

    def settle(self) -> Materialised:
        """Counted by a job of its own, which reads the batch (and stores it) to the
        ``noop`` sink, as ``materialise`` does when not deferred."""
        observation = self.observation()
        self.root.write.format("noop").mode("overwrite").save()
        return self.resolve(observation, self.batch)  # root is read whole: always made

    def resolve(self, observation: Any, batch: Any = None) -> Materialised:
        """The batch counted from ``observation``, which a job that read it completes;
        ``batch``: what the attempt's plans read (None: ``kept``). Should no query
        complete it within ``OBSERVED_WAIT_S`` of the job, or complete it empty (Spark
        drops an observation under a filter it knows keeps nothing), a job of its own
        counts the batch (``settle``)."""
        got = _observed_now(self.spark, observation)
        if got is None:
            if batch is not None:
                raise RuntimeError("a batch's own counting job left its observation empty")
            log.info(kv("batch_counted_apart", reason="the committers' job did not count it"))
            return self.settle()
        records, digests, tally = self._engine.count_of(self._read, got)
        return Materialised(self.kept if batch is None else batch, records, digests, tally)


#: How long ``Pending.resolve`` waits for Spark to complete an observation after the
#: job that makes it (its listener bus delivers the query's end).
OBSERVED_WAIT_S = 30.0


def _observed_now(spark: SparkSession, observation: Any) -> dict[str, Any] | None:
    """``observation``'s metrics, once its query has ended (within ``OBSERVED_WAIT_S``);
    None if it was not completed, or completed without them."""
    jvm: Any = spark._jvm
    wait = jvm.scala.concurrent.duration.Duration.apply(int(OBSERVED_WAIT_S * 1000), "ms")
    try:
        jvm.scala.concurrent.Await.ready(observation._jo.future(), wait)
        got = dict(observation.get)
    except Exception:  # not completed in time, or completed with an empty row
        return None
    return got or None


class Engine(Protocol):
    spark: Any

    def materialise(
        self,
        frames: Sequence[Any],
        digest: bool,
        partitions: int | None = None,
        ids: RecordIds | None = None,
        defer: bool = False,
    ) -> Materialised: ...

    def job_group(self, group: str, txid: int | None = None) -> Any: ...

    def revive(self) -> None: ...

    def describe(self, text: str) -> None: ...

    def cancel(self, group: str) -> None: ...

    def is_frame(self, value: object) -> bool: ...

    def collect(self, frames: Mapping[Any, Any]) -> dict[Any, Any]: ...

    def jobs(self, group: str) -> int | None: ...

    def replan(self, frames: Sequence[Any], was: Any, observed: Sequence[Any] = ()) -> Any: ...

    def mark(self) -> int: ...

    def release(self, frames: Iterable[Any], since: int) -> int: ...


#: The low 32 bits of a long.
_LOW32 = 0xFFFFFFFF
#: The Spark scheduler pool of the oldest attempt being processed and of every commit
#: (``SparkEngine.job_group``). ``transactional.spark.session`` defines it, in ``FAIR`` mode,
#: with a minimum share no application reaches, so its tasks always go first.
FIRST_POOL = "transactional-first"
#: The calling thread's Spark properties a job group sets; leaving the group gives them
#: back the values they had (a user's own pool or group on the warm-up's thread).
_GROUP_PROPERTIES = (
    "spark.jobGroup.id",
    "spark.job.description",
    "spark.job.interruptOnCancel",
    "spark.scheduler.pool",
)

#: The partition tag carried through the checkpoint when digests are asked for (the
#: spouts' ``PARTITION_COLUMN``: a spout's one frame of all partitions comes tagged).
_PARTITION = PARTITION_COLUMN


class SparkEngine:
    """Materialises with a lazy ``localCheckpoint``: the job that counts the batch (or
    digests it) also stores its rows, every later job of the attempt reads those
    blocks, and the lineage is cut, so a lost block fails the attempt instead of
    silently re-reading a changed source. (An eager checkpoint would cost a job of its
    own before the count.)

    The count, and the digest of a batch of one frame, are observed while one job
    writes the batch to Spark's ``noop`` sink (``DataFrame.observe``): no shuffle, where
    a count would add one and, with adaptive execution, a second job. Observed metrics
    come from a result stage, whose tasks' updates Spark applies once each.

    Digests cost no extra read of the source: each partition's count and
    ``sum(xxhash64(row))`` are summed so that they cannot overflow and do not depend on
    row order. A batch of one frame, one partition, needs no tag. A batch of several is
    tagged. A large one has its digests from one ``groupBy`` on the tag, whose map
    stage stores the rows: two jobs, but one hash update a row, where observing three
    conditional sums per partition cost more from two partitions on
    (benchmarks/analysis.md, fifteenth round). A small one (up to ``OBSERVED_PARTITIONS``
    partitions, the batch before it within ``ROWS_PER_TASK`` rows) has them observed, as
    one frame's are: there the second job costs more than the sums (a 10-record batch:
    50 ms against 90). Both give the same digests, so a replay may take either.

    The ledger's ids (``ids``) are computed in the same pass, before the checkpoint (an
    id from a row's place in the frames must be computed once), and their count and
    XOR are observed or aggregated beside the count and the digests; the digests leave
    the id column out, so a txid digested with the ledger on and replayed with it off
    (or the reverse) still compares equal.

    Deferred (``defer``, with plans built once), a small batch is returned kept but not
    read, the same observations ``Pending``: made by the first job that reads it
    (docs/architecture.md, "Plans built once").
    """

    #: The ledger can count this engine's batches (``transactional.ledger``).
    counts_ids = True

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        #: ``FIRST_POOL`` when the session defines it (None: one queue, as before).
        self.first_pool = self._first_pool(spark)
        self._lock = threading.Lock()
        self._processing: dict[int, int] = {}  # txid -> job groups processing it
        #: The calling thread's job group: ``in_group`` and the ``txid`` it processes
        #: (None: a commit or the warm-up).
        self._local = threading.local()
        #: The last batch of several partitions fitted a task (``ROWS_PER_TASK``): the
        #: next is taken to be small too, and its digests observed (``materialise``).
        self._small = True

    @staticmethod
    def _first_pool(spark: SparkSession) -> str | None:
        return pool_defined(spark, FIRST_POOL)

    #: ``materialise`` may defer the count (``Pending``): a classic session's observations
    #: can be registered for a plan after it is built.
    defers = True

    def materialise(
        self,
        frames: Sequence[DataFrame],
        digest: bool,
        partitions: int | None = None,
        ids: RecordIds | None = None,
        defer: bool = False,
    ) -> Materialised:
        """``frames``: one frame per partition; or, with ``partitions``, one frame of
        that many partitions, each row tagged with its own in ``PARTITION_COLUMN``.
        ``ids``: give each record its ledger id (``ledger.ID``) and tally them.
        ``defer``: a batch expected to be small (the last one was) is returned not yet
        read, as one task, its count ``Pending``; no job runs here."""

        self._place()
        kept: list[DataFrame] = []  # the checkpoint, once made
        try:
            read = _Read.of(frames, digest, partitions, ids)
            kept.append(read.kept)
            # Untagged, its count and digest are observed whatever its size; tagged,
            # after a small batch only (``_grouped``).
            if read.observable and (self._small or read.partitions is None):
                if defer and self.defers and self._small:
                    return Materialised(read.kept, -1, pending=Pending(read, self))
                records, digests, tally = self.count_of(read, _observed(read.kept, read.metrics()))
                batch = _few_tasks(read.unmarked(read.kept), records)
                return Materialised(batch, records, digests, tally)
            return self._grouped(read)
        except BaseException:
            # Its job failed or was cancelled (the attempt superseded or timed out): the
            # blocks it stored would stay until the driver's collector lets Spark's
            # cleaner see the frame gone, for the attempt's own release never got it.
            # Its only leaf is the checkpoint made here (it cuts the lineage).
            with contextlib.suppress(Exception):
                self.release(kept, -1)
            raise

    def count_of(self, read: _Read, got: Any) -> tuple[int, dict[int, Digest] | None, Tally | None]:
        """``read``'s records, digests and tally from its observed metrics ``got``; the
        next batch is taken to be as small or large as this one."""
        records, digests, tally = read.decode(got)
        self._small = records <= ROWS_PER_TASK
        return records, digests, tally

    def _grouped(self, read: _Read) -> Materialised:
        """A tagged batch's digests from one aggregation by the tag (``_grouped_digests``):
        more partitions than a small batch observes, or after a large batch."""
        assert read.partitions is not None
        counted = id_sums() if read.ids is not None else []
        batch = read.unmarked(read.kept)
        rows = _grouped_digests(read.kept, _row_hash(batch), read.partitions, counted)
        found = {p: _digest(r) for p, r in rows.items()}
        tally = None
        if read.ids is not None:
            tally = Tally()
            for r in rows.values():
                tally = tally + Tally.of(r["ledger_n"], r["ledger_x"])
        digests = {p: found.get(p, (0, "0")) for p in range(read.partitions)}
        records = sum(n for n, _ in digests.values())
        self._small = records <= ROWS_PER_TASK
        return Materialised(_few_tasks(batch, records), records, digests, tally)

    @contextmanager
    def job_group(self, group: str, txid: int | None = None) -> Iterator[None]:
        """The calling thread's jobs in ``group`` until the block ends. ``txid``: the
        group processes that txid's attempt, whose jobs go first (``FIRST_POOL``) while
        it is the oldest being processed, and after the others' otherwise. Without it
        (a commit, the warm-up) they always go first: every later txid waits for the
        commit.

        Why: attempts processed side by side, their jobs queued in one line, share the
        cores and end together, then commit one after the other while the cores idle.
        The oldest first ends each attempt in turn, its commit beside the next one's
        work: 11.7 s against 12.3 s a run of the tweet benchmark (analysis.md,
        sixteenth round)."""
        sc = self.spark.sparkContext
        before = {key: sc.getLocalProperty(key) for key in _GROUP_PROPERTIES}
        outer = getattr(self._local, "in_group", False), getattr(self._local, "txid", None)
        sc.setJobGroup(group, group, interruptOnCancel=True)
        if txid is not None:
            with self._lock:
                self._processing[txid] = self._processing.get(txid, 0) + 1
        self._local.in_group, self._local.txid = True, txid
        self._place()
        try:
            yield
        finally:
            self._local.in_group, self._local.txid = outer
            if txid is not None:
                with self._lock:
                    left = self._processing.pop(txid) - 1
                    if left:
                        self._processing[txid] = left
            for key, value in before.items():
                sc.setLocalProperty(key, value)  # type: ignore[arg-type]

    def _place(self) -> None:
        """Put the calling thread's next jobs in ``FIRST_POOL`` or in the default pool,
        by its job group's txid now (called before each job: the oldest attempt being
        processed changes as attempts end). Outside a group, or on a session without the
        pool, the thread's pool is left as it is."""
        if self.first_pool is None or not getattr(self._local, "in_group", False):
            return
        txid = self._local.txid
        with self._lock:
            first = txid is None or txid == min(self._processing, default=txid)
        pool = self.first_pool if first else None
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", pool)  # type: ignore[arg-type]

    def revive(self) -> None:
        """Before an attempt starts (its spout's calls included, outside any job group):
        make the session usable again if it can be. A classic session has nothing to
        reopen."""
        return None

    def describe(self, text: str) -> None:
        """The description the Spark UI shows for the calling thread's next jobs (PySpark
        pins each Python thread to a JVM thread, so it is the thread's own)."""
        self.spark.sparkContext.setJobDescription(text)

    def cancel(self, group: str) -> None:
        """Cancel ``group``'s running jobs. A group with none is left alone: Spark would
        log a warning (``Cannot find active jobs``) for a cancel that had nothing to do."""
        sc = self.spark.sparkContext
        tracker = sc.statusTracker()
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            if info is not None and info.status == "RUNNING":
                sc.cancelJobGroup(group)
                return

    def collect(self, frames: Mapping[Any, DataFrame]) -> dict[Any, pa.Table]:
        """``collect_arrow``: every frame as Arrow, by one Spark action each, each put
        in its pool as it starts."""
        return collect_arrow(frames, self._place)

    def replan(
        self, frames: Sequence[DataFrame], was: DataFrame, observed: Sequence[DataFrame] = ()
    ) -> Replan | None:
        """``frames``, built over ``was`` (a batch ``materialise`` returned), ready to be
        re-pointed at later batches (``Replan``); ``observed``: those of them whose
        observation each later attempt makes its own. None where Spark would not
        re-point them all."""
        return Replan.of(self.spark, frames, was, observed)

    def jobs(self, group: str) -> int | None:
        """How many Spark jobs ran in ``group`` (None: Spark no longer knows), as far as
        Spark's status store has heard: its listener bus may not yet have delivered the
        last job's start (a metric, never waited for). With adaptive execution each
        shuffle's map stage is a job of its own."""
        ids = self.spark.sparkContext.statusTracker().getJobIdsForGroup(group)
        return len(ids) if ids else None

    def mark(self) -> int:
        """A mark before an attempt's frames are made: every RDD made after it has a
        greater id (Spark numbers RDDs in order, across threads; taking a number costs
        one)."""
        return int(self.spark.sparkContext._jsc.sc().newRddId())

    def release(self, frames: Iterable[DataFrame], since: int) -> int:
        """Drop the kept blocks of every local checkpoint ``frames`` read that was made
        after ``since`` (``mark``): the batch the attempt materialised and the bolts' own
        checkpoints, once the attempt is over (committed or dropped). Left to Spark, they
        stay until the driver's garbage collector lets the ``ContextCleaner`` see them
        gone: a long run's memory store fills with txids long committed, spills them to
        disk, and the collector marks them over and over. A checkpoint made before the
        attempt (one a spout keeps across txids) is never touched. Returns how many were
        released."""
        released = set()
        for frame in frames:
            leaves = frame._jdf.queryExecution().analyzed().collectLeaves().iterator()
            while leaves.hasNext():
                leaf = leaves.next()
                if leaf.getClass().getSimpleName() != "LogicalRDD":
                    continue
                rdd = leaf.rdd()
                number = rdd.id()
                if number <= since or number in released or not rdd.isLocallyCheckpointed():
                    continue
                rdd.unpersist(False)
                released.add(number)
        return len(released)

    def is_frame(self, value: object) -> bool:
        from pyspark.sql import DataFrame

        # Spark Connect frames subclass DataFrame too, but the runner's session is classic.
        return isinstance(value, DataFrame) and not type(value).__module__.startswith(
            "pyspark.sql.connect"
        )


class ConnectEngine(SparkEngine):
    """``SparkEngine`` on a Spark Connect session: the same batch operations (observed
    metrics and Arrow collection are DataFrame calls), and no py4j. A job group is a
    job tag (``addTag``, per client thread, as a job group is per thread), cancelled
    with ``interruptTag``. What Connect has no call for is left out:
    scheduler pools (a Connect client cannot set a thread's pool, so attempts share the
    server's cores in one queue), job descriptions, and the count of a group's jobs
    (a metric: None).

    Keeping and releasing: a local checkpoint the client drops on Connect
    (``CachedRemoteRelation.__del__``) keeps its blocks on the server while the
    server's plan cache holds its plan and until its JVM collects it (30 min apart by
    default). So the batch, and what bolts and committers keep through
    ``checkpoint``, is persisted instead, listed per attempt (``mark``, on the
    attempt's thread), and unpersisted by ``release`` when the attempt is over. A lost
    block is then recomputed from the batch's stored ranges rather than failing the
    attempt. A spout's or bolt's own ``localCheckpoint`` is left to the server."""

    counts_ids = True

    def __init__(self, spark: SparkSession) -> None:
        super().__init__(spark)
        self._next = 0
        self._kept: dict[int, list[Any]] = {}  # mark -> the frames persisted since

    @staticmethod
    def _first_pool(spark: SparkSession) -> str | None:
        return None  # a Connect client cannot set a thread's pool (no py4j)

    #: No deferred count: a Connect client registers no observation for a plan built.
    defers = False

    def replan(
        self, frames: Sequence[DataFrame], was: DataFrame, observed: Sequence[DataFrame] = ()
    ) -> Replan | None:
        """None: a Connect client holds no plan to re-point (its plans are built on
        the client without round trips to Spark, and analysed on the server anyway)."""
        return None

    @contextmanager
    def job_group(self, group: str, txid: int | None = None) -> Iterator[None]:
        """The calling thread's operations tagged ``group`` until the block ends; a
        session the server lost (restarted) reopened first (``revive``)."""
        self.revive()
        self.spark.addTag(group)
        try:
            yield
        finally:
            self.spark.removeTag(group)

    def _place(self) -> None:
        return None

    def revive(self) -> None:
        """A session whose server was restarted (PySpark closes its client for good when
        a reply comes from another server session) is reopened (``reopen_if_lost``).
        Called before every attempt's start, in every job group and at every cancel:
        a thread whose request was under way with the old server's session id closes
        the client again after another thread reopened it, and the next attempt of
        any phase must not meet it closed (an attempt that fails at its start is not
        cancelled: its spout's calls would fail on a closed client at every retry)."""
        reopen_if_lost(self.spark)

    def describe(self, text: str) -> None:
        return None

    def cancel(self, group: str) -> None:
        """Interrupt the operations tagged ``group`` (none running: nothing happens).
        Called for every failed attempt: a session the server lost (restarted) is
        reopened here first (``revive``), so that the attempt's replay runs on the new
        server."""
        self.revive()
        self.spark.interruptTag(group)

    def jobs(self, group: str) -> int | None:
        return None

    def mark(self) -> int:
        """Start the calling thread's list of frames ``checkpoint`` persists (an
        attempt's steps run on one thread); the key of that list."""
        with self._lock:
            self._next += 1
            key = self._next
            self._kept[key] = _KEPT.frames = []
        return key

    def release(self, frames: Iterable[Any], since: int) -> int:
        """Unpersist the frames ``checkpoint`` persisted since ``mark`` returned
        ``since`` (``frames`` need not be walked: the list holds them); -1 (a failed
        materialisation) leaves them to the attempt's own release. Returns how many."""
        with self._lock:
            kept = self._kept.pop(since, [])
        for frame in kept:
            frame.unpersist(blocking=False)
        return len(kept)

    def is_frame(self, value: object) -> bool:
        from pyspark.sql.connect.dataframe import DataFrame as ConnectFrame

        return isinstance(value, ConnectFrame)


def engine_for(spark: Any) -> SparkEngine:
    """The engine for ``spark``: ``ConnectEngine`` on a Spark Connect session,
    ``SparkEngine`` on a classic one."""
    return ConnectEngine(spark) if is_connect(spark) else SparkEngine(spark)


def pool_defined(spark: SparkSession, pool: str) -> str | None:
    """``pool`` if the session's scheduler has it (a ``FAIR`` scheduler whose allocation
    file defines it), else None."""
    return pool if spark.sparkContext._jsc.sc().getPoolForName(pool).isDefined() else None


def collect_arrow(
    frames: Mapping[Any, DataFrame], before_each: Callable[[], None] | None = None
) -> dict[Any, pa.Table]:
    """Every frame of ``frames`` brought to the driver as Arrow, one job each, in the
    caller's job group (cancelling the attempt cancels them).

    Measured on the tweet topology (benchmarks/analysis.md): stacking the frames into
    one (a tagged union, one job) took 0.8 to 1.0 s per txid where these jobs took 0.25 s
    together; the frames share their input, read once, from the attempt's checkpointed
    batch either way. Submitted from concurrent threads they took 0.17 s, but Spark then
    logged errors for the late task reports of plans already released."""
    collected = {}
    for name, frame in frames.items():
        if before_each is not None:
            before_each()
        collected[name] = frame.toArrow()
    return collected


#: Rows of a checkpointed batch per task of the jobs that read it.
ROWS_PER_TASK = 65_536


def _few_tasks(batch: DataFrame, records: int) -> DataFrame:
    """The checkpointed batch read by one task per ``ROWS_PER_TASK`` rows: a partition
    per source split (often dozens) costs a task each in every later stage, 20 to 40 ms
    apiece on a small machine, where a whole small batch takes less (a narrow
    coalesce: no shuffle, the blocks are only grouped)."""
    return batch.coalesce(max(1, -(-records // ROWS_PER_TASK)))


@dataclass(frozen=True)
class _Read:
    """A batch kept (``checkpoint``, lazily: not yet read) and what observing it gives:
    its count, with ``digest`` each partition's digest, with ``ids`` the ledger's
    tally. ``partitions``: the rows are tagged with their partition (``_PARTITION``)."""

    kept: DataFrame
    digest: bool
    ids: RecordIds | None
    partitions: int | None = None

    @classmethod
    def of(
        cls,
        frames: Sequence[DataFrame],
        digest: bool,
        partitions: int | None,
        ids: RecordIds | None,
    ) -> _Read:
        """``materialise``'s frames kept: one frame untagged (or all of them when not
        digested), else tagged."""
        from pyspark.sql import functions as F

        if not digest:
            union = _union(frames)
            if partitions is not None:
                union = union.drop(_PARTITION)
            return cls(checkpoint(_with_ids(union, ids)), False, ids)
        if partitions is None and len(frames) == 1:
            return cls(checkpoint(_with_ids(frames[0], ids)), True, ids)
        if partitions is None:
            partitions = len(frames)
            tagged = _union([f.withColumn(_PARTITION, F.lit(p)) for p, f in enumerate(frames)])
        else:
            tagged = frames[0].withColumn(_PARTITION, F.col(_PARTITION).cast("int"))
        return cls(checkpoint(_with_ids(tagged, ids)), True, ids, partitions)

    @property
    def observable(self) -> bool:
        """Whether one observation gives it all (a tagged batch of more partitions has
        its digests grouped: ``_grouped_digests``)."""
        return self.partitions is None or self.partitions <= OBSERVED_PARTITIONS

    def unmarked(self, frame: DataFrame) -> DataFrame:
        """``frame`` (the kept batch, or over it) without the partition tag."""
        return frame if self.partitions is None else frame.drop(_PARTITION)

    def metrics(self) -> list[Column]:
        """The aggregates to observe, built once per schema and session (``prebuilt``):
        ``n``, or ``_digest_sums``, or per partition ``_digest_metrics``; and the ids'
        ``id_sums``."""
        from pyspark.sql import functions as F

        fields = tuple((f.name, f.dataType.simpleString()) for f in self.kept.schema.fields)
        key = ("read_metrics", self.digest, self.partitions, self.ids is not None, fields)
        # The row hash is built (and kept) first: ``prebuilt`` does not nest.
        h = _row_hash(self.unmarked(self.kept)) if self.digest else None

        def build() -> list[Column]:
            if h is None:
                counts = [F.count(F.lit(1)).alias("n")]
            elif self.partitions is None:
                counts = _digest_sums(h)
            else:
                counts = _digest_metrics(h, self.partitions)
            return [*counts, *(id_sums() if self.ids is not None else [])]

        return prebuilt(self.kept, key, build)

    def decode(self, got: Any) -> tuple[int, dict[int, Digest] | None, Tally | None]:
        """The records, digests (None: not digested) and tally from ``metrics`` observed."""
        tally = _tally(got, self.ids)
        if not self.digest:
            return int(got["n"]), None, tally
        if self.partitions is None:
            digest_of = _digest(got)
            return digest_of[0], {0: digest_of}, tally
        found = _digests_observed(got, self.partitions)
        digests = {p: found.get(p, (0, "0")) for p in range(self.partitions)}
        return sum(n for n, _ in digests.values()), digests, tally


def _observed(frame: DataFrame, metrics: list[Column]) -> dict[str, Any]:
    """``metrics`` (aggregates) over ``frame``, observed while one job writes it to the
    ``noop`` sink: every row is computed (and a lazy checkpoint stored), nothing kept."""
    from pyspark.sql import Observation

    observation = Observation(f"materialise-{uuid.uuid4().hex}")
    frame.observe(observation, *metrics).write.format("noop").mode("overwrite").save()
    return dict(observation.get)


def _digest_sums(h: Column) -> list[Column]:
    """The aggregates a digest is made of: the row count and sum(h) as two sums of
    longs, of the high 32 bits (signed) and of the low 32 bits; each fits a long for
    2^31 rows, and hi * 2^32 + lo is sum(h) exactly. (A decimal sum gives the same
    number, slower: Spark adds decimals as BigDecimal.) Aliased ``n``, ``hi``, ``lo``."""
    from pyspark.sql import functions as F

    return [
        F.count(F.lit(1)).alias("n"),
        F.sum(F.shiftright(h, 32)).alias("hi"),
        F.sum(h.bitwiseAND(F.lit(_LOW32))).alias("lo"),
    ]


#: Partitions whose digests a small batch observes (three sums each) instead of grouping.
OBSERVED_PARTITIONS = 16


def _digest_metrics(h: Column, partitions: int) -> list[Column]:
    """Each partition's ``_digest_sums`` as conditional aggregates on the tag, and the
    rows tagged with none of them (``strays``, the least such tag ``stray``)."""
    from pyspark.sql import functions as F

    tag = F.col(_PARTITION)
    metrics = []
    for p in range(partitions):
        on = tag == p
        metrics += [
            F.count(F.when(on, 1)).alias(f"n{p}"),
            F.sum(F.when(on, F.shiftright(h, 32))).alias(f"hi{p}"),
            F.sum(F.when(on, h.bitwiseAND(F.lit(_LOW32)))).alias(f"lo{p}"),
        ]
    stray = tag.isNull() | (tag < 0) | (tag >= partitions)
    return [
        *metrics,
        F.count(F.when(stray, 1)).alias("strays"),
        F.min(F.when(stray, tag)).alias("stray"),
    ]


def _digests_observed(got: Any, partitions: int) -> dict[int, Digest]:
    """The digests of the partitions with rows, from ``_digest_metrics`` observed;
    stray tags refused."""
    if got["strays"]:
        _refuse_strays([got["stray"]], partitions)
    return {
        p: _digest({"n": got[f"n{p}"], "hi": got[f"hi{p}"], "lo": got[f"lo{p}"]})
        for p in range(partitions)
        if got[f"n{p}"]
    }


def _digest(got: Any) -> Digest:
    """The digest from ``_digest_sums``' results (a row or a dict; a sum over no rows
    is null)."""
    hi, lo = got["hi"] or 0, got["lo"] or 0
    return int(got["n"]), str((hi << 32) + lo)


def _with_ids(frame: DataFrame, ids: RecordIds | None) -> DataFrame:
    """``frame`` with each record's ledger id, when asked for."""
    if ids is None:
        return frame
    if ids.position:
        check_positions(ids, frame.columns)
    return frame.select("*", id_column(ids))


def _tally(got: Any, ids: RecordIds | None) -> Tally | None:
    return None if ids is None else Tally.of(got["ledger_n"], got["ledger_x"])


def _grouped_digests(
    tagged: DataFrame, h: Column, partitions: int, extra: Sequence[Column] = ()
) -> dict[int, Any]:
    """Each partition's row of digest sums (and ``extra`` aggregates), from one
    aggregation by the partition tag, whose map stage also materialises the checkpoint.
    (A batch of one partition has its digest observed in the materialising job instead:
    no tag to store with each row or to test per partition; measured: a fifth of the
    materialising job's CPU on a 125,000-line batch.)"""
    rows = tagged.groupBy(_PARTITION).agg(*_digest_sums(h), *extra).collect()
    found = {r[_PARTITION]: r for r in rows}
    strays = [p for p in found if p is None or not 0 <= p < partitions]
    if strays:
        _refuse_strays(strays, partitions)
    return found


def _refuse_strays(strays: Sequence[int | None], partitions: int) -> None:
    """Rows tagged with ``strays`` (None: no tag): a broken ``emit_partitions``."""
    stray = min((p for p in strays if p is not None), default=None)
    which = f"partition {stray}" if stray is not None else "no partition"
    raise ContractError(
        f"the batch's one frame of {partitions} partitions holds rows tagged with "
        f"{which} in {_PARTITION}: emit_partitions must tag each row with its "
        f"partition, 0 to {partitions - 1}"
    )


def _union(frames: Sequence[DataFrame]) -> DataFrame:
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def _row_hash(batch: DataFrame) -> Column:
    """``xxhash64`` of every column but the ledger's id, maps first turned into their
    sorted entries (Spark does not hash maps, and a map's entry order is not part of its
    value)."""
    fields = [f for f in batch.schema.fields if f.name != ID]
    key = ("row_hash", *((f.name, f.dataType.simpleString()) for f in fields))
    return prebuilt(batch, key, partial(_hash_of, fields))


def _hash_of(fields: Sequence[StructField]) -> Column:
    """``_row_hash`` of a schema's ``fields``, built once per schema and session
    (``transactional.spark.columns``): a column a field costs a round trip to the JVM."""
    from pyspark.sql import functions as F

    columns = [_hashable(F.col(f"`{f.name}`"), f.dataType) for f in fields]
    return F.xxhash64(*columns) if columns else F.lit(0)


def _hashable(column: Column, data_type: DataType) -> Column:
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    if isinstance(data_type, MapType):
        return F.array_sort(F.map_entries(column))
    return column
