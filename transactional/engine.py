"""The few batch operations the runner needs, behind a small protocol, so the state
machine can be unit-tested with in-memory frames and run on Spark in production."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from transactional.errors import ContractError
from transactional.spout import PARTITION_COLUMN

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

#: A partition's record count and order-independent content checksum (a decimal string).
Digest = tuple[int, str]


@dataclass(frozen=True)
class Materialised:
    """One attempt's batch, read once: ``batch`` is what the bolts see, ``records`` its
    row count, ``digests`` (when asked for) the digest of each emitted partition."""

    batch: Any
    records: int
    digests: dict[int, Digest] | None = None


class Engine(Protocol):
    spark: Any

    def materialise(
        self, frames: Sequence[Any], digest: bool, partitions: int | None = None
    ) -> Materialised: ...

    def job_group(self, group: str) -> Any: ...

    def describe(self, text: str) -> None: ...

    def cancel(self, group: str) -> None: ...

    def is_frame(self, value: object) -> bool: ...

    def collect(self, frames: Mapping[Any, Any]) -> dict[Any, Any]: ...

    def jobs(self, group: str) -> int | None: ...


#: The low 32 bits of a long.
_LOW32 = 0xFFFFFFFF
#: The partition tag carried through the checkpoint when digests are asked for (the
#: spouts' ``PARTITION_COLUMN``: a spout's one frame of all partitions comes tagged).
_PARTITION = PARTITION_COLUMN


class SparkEngine:
    """Materialises with a lazy ``localCheckpoint``: the one job that counts the batch
    (or digests it) also stores its rows, every later job of the attempt reads those
    blocks, and the lineage is cut, so a lost block fails the attempt instead of
    silently re-reading a changed source. (An eager checkpoint would cost a job of its
    own before the count.)

    Digests cost no extra read of the source: the partitions are tagged, checkpointed
    together, and that one aggregation gives each partition's count and
    ``sum(xxhash64(row))``, summed so that it cannot overflow and does not depend on
    row order.
    """

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def materialise(
        self, frames: Sequence[DataFrame], digest: bool, partitions: int | None = None
    ) -> Materialised:
        """``frames``: one frame per partition; or, with ``partitions``, one frame of
        that many partitions, each row tagged with its own in ``PARTITION_COLUMN``."""
        from pyspark.sql import functions as F

        if not digest:
            union = _union(frames)
            if partitions is not None:
                union = union.drop(_PARTITION)
            batch = union.localCheckpoint(eager=False)
            records = int(batch.count())
            return Materialised(_few_tasks(batch, records), records)
        if partitions is None:
            partitions = len(frames)
            tagged = _union([f.withColumn(_PARTITION, F.lit(p)) for p, f in enumerate(frames)])
        else:
            tagged = frames[0].withColumn(_PARTITION, F.col(_PARTITION).cast("int"))
        tagged = tagged.localCheckpoint(eager=False)
        batch = tagged.drop(_PARTITION)
        # sum(h) as two sums of longs: of the high 32 bits (signed) and of the low 32
        # bits; each fits a long for 2^31 rows, and hi * 2^32 + lo is sum(h) exactly.
        # (A decimal sum gives the same number, slower: Spark adds decimals as BigDecimal.)
        h = _row_hash(batch)
        rows = (
            tagged.groupBy(_PARTITION)
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.sum(F.shiftright(h, 32)).alias("hi"),
                F.sum(h.bitwiseAND(F.lit(_LOW32))).alias("lo"),
            )
            .collect()
        )
        found = {int(r[_PARTITION]): (int(r["n"]), str((r["hi"] << 32) + r["lo"])) for r in rows}
        strays = sorted(set(found) - set(range(partitions)))
        if strays:
            raise ContractError(
                f"the batch's one frame of {partitions} partitions holds rows tagged with "
                f"partition {strays[0]} in {_PARTITION}: emit_partitions must tag each row "
                f"with its partition, 0 to {partitions - 1}"
            )
        digests = {p: found.get(p, (0, "0")) for p in range(partitions)}
        records = sum(n for n, _ in digests.values())
        return Materialised(_few_tasks(batch, records), records, digests)

    @contextmanager
    def job_group(self, group: str) -> Iterator[None]:
        sc = self.spark.sparkContext
        sc.setJobGroup(group, group, interruptOnCancel=True)
        try:
            yield
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]

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
        """``collect_arrow``: every frame as Arrow, by one Spark action."""
        return collect_arrow(frames)

    def jobs(self, group: str) -> int | None:
        """How many Spark jobs ran in ``group`` (None: Spark no longer knows). With
        adaptive execution each shuffle's map stage is a job of its own."""
        ids = self.spark.sparkContext.statusTracker().getJobIdsForGroup(group)
        return len(ids) if ids else None

    def is_frame(self, value: object) -> bool:
        from pyspark.sql import DataFrame

        # Spark Connect frames subclass DataFrame too, but the runner's session is classic.
        return isinstance(value, DataFrame) and not type(value).__module__.startswith(
            "pyspark.sql.connect"
        )


def collect_arrow(frames: Mapping[Any, DataFrame]) -> dict[Any, pa.Table]:
    """Every frame of ``frames`` brought to the driver as Arrow, one job each, in the
    caller's job group (cancelling the attempt cancels them).

    Measured on the tweet topology (benchmarks/analysis.md): stacking the frames into
    one (a tagged union, one job) took 0.8 to 1.0 s per txid where these jobs took 0.25 s
    together; the frames share their input, read once, from the attempt's checkpointed
    batch either way. Submitted from concurrent threads they took 0.17 s, but Spark then
    logged errors for the late task reports of plans already released."""
    return {name: frame.toArrow() for name, frame in frames.items()}


#: Rows of a checkpointed batch per task of the jobs that read it.
ROWS_PER_TASK = 65_536


def _few_tasks(batch: DataFrame, records: int) -> DataFrame:
    """The checkpointed batch read by one task per ``ROWS_PER_TASK`` rows: a partition
    per source split (often dozens) costs a task each in every later stage, 20 to 40 ms
    apiece on a small machine, where a whole small batch takes less (a narrow
    coalesce: no shuffle, the blocks are only grouped)."""
    return batch.coalesce(max(1, -(-records // ROWS_PER_TASK)))


def _union(frames: Sequence[DataFrame]) -> DataFrame:
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def _row_hash(batch: DataFrame) -> Column:
    """``xxhash64`` of every column, maps first turned into their sorted entries (Spark
    does not hash maps, and a map's entry order is not part of its value)."""
    from pyspark.sql import functions as F

    columns = [_hashable(F.col(f"`{f.name}`"), f.dataType) for f in batch.schema.fields]
    return F.xxhash64(*columns) if columns else F.lit(0)


def _hashable(column: Column, data_type: DataType) -> Column:
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    if isinstance(data_type, MapType):
        return F.array_sort(F.map_entries(column))
    return column
