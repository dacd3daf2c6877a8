"""The few batch operations the runner needs, behind a small protocol, so the state
machine can be unit-tested with in-memory frames and run on Spark in production."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class Engine(Protocol):
    spark: Any

    def union(self, frames: Sequence[Any]) -> Any: ...

    def materialise(self, frame: Any) -> Any: ...

    def count(self, frame: Any) -> int: ...

    def job_group(self, group: str) -> Any: ...

    def cancel(self, group: str) -> None: ...

    def is_frame(self, value: object) -> bool: ...


class SparkEngine:
    """Materialises with ``localCheckpoint``: blocks are kept and lineage cut, so a
    lost block fails the attempt instead of silently re-reading a changed source."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def union(self, frames: Sequence[DataFrame]) -> DataFrame:
        result = frames[0]
        for frame in frames[1:]:
            result = result.unionByName(frame)
        return result

    def materialise(self, frame: DataFrame) -> DataFrame:
        return frame.localCheckpoint(eager=True)

    def count(self, frame: DataFrame) -> int:
        return int(frame.count())

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

        return isinstance(value, DataFrame)
