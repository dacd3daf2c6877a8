"""The few batch operations the runner needs, behind a small protocol, so the state
machine can be unit-tested with in-memory frames and run on Spark in production."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
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

    def materialise(self, frames: Sequence[Any], digest: bool) -> Materialised: ...

    def job_group(self, group: str) -> Any: ...

    def cancel(self, group: str) -> None: ...

    def is_frame(self, value: object) -> bool: ...


#: The low 32 bits of a long.
_LOW32 = 0xFFFFFFFF
#: The partition tag carried through the checkpoint when digests are asked for.
_PARTITION = "__transactional_partition"


class SparkEngine:
    """Materialises with ``localCheckpoint``: blocks are kept and lineage cut, so a
    lost block fails the attempt instead of silently re-reading a changed source.

    Digests cost no extra read of the source: the partitions are tagged, checkpointed
    together, and one aggregation over the checkpoint (the job that would count the
    batch anyway) gives each partition's count and ``sum(xxhash64(row))``, summed as a
    decimal so it cannot overflow and does not depend on row order.
    """

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def materialise(self, frames: Sequence[DataFrame], digest: bool) -> Materialised:
        from pyspark.sql import functions as F

        if not digest:
            batch = _union(frames).localCheckpoint(eager=True)
            return Materialised(batch, int(batch.count()))
        tagged = _union([f.withColumn(_PARTITION, F.lit(p)) for p, f in enumerate(frames)])
        tagged = tagged.localCheckpoint(eager=True)
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
        digests = {p: found.get(p, (0, "0")) for p in range(len(frames))}
        return Materialised(batch, sum(n for n, _ in digests.values()), digests)

    @contextmanager
    def job_group(self, group: str) -> Iterator[None]:
        sc = self.spark.sparkContext
        sc.setJobGroup(group, group, interruptOnCancel=True)
        try:
            yield
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]

    def cancel(self, group: str) -> None:
        self.spark.sparkContext.cancelJobGroup(group)

    def is_frame(self, value: object) -> bool:
        from pyspark.sql import DataFrame

        # Spark Connect frames subclass DataFrame too, but the runner's session is classic.
        return isinstance(value, DataFrame) and not type(value).__module__.startswith(
            "pyspark.sql.connect"
        )


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
