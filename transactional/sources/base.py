"""What every ready-made source shares: the session it gets at ``open``, the size of a
new txid, and the lazy frame whose reading runs in Spark tasks."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from transactional.errors import ConfigurationError, EmitError
from transactional.spout import PartitionedTransactionalSpout
from transactional.types import M, TransactionAttempt

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from transactional.spout import SpoutContext


class SourceBase:
    """The session arrives at ``open``, not at construction, so that a spout can be built
    and its topology validated before Spark is started."""

    _context: SpoutContext | None = None
    batch_size: int
    start: Any = "earliest"
    #: Every ready-made source reads ``--start-from`` (``parse_start``).
    accepts_start_from: ClassVar[bool] = True
    #: The spout's ``stored_name`` (``transactional.spout``): its identity begins with it.
    stored_name: ClassVar[str]

    def __init__(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ConfigurationError(
                f"{type(self).__name__}: batch_size must be at least 1, not {batch_size}"
            )
        self.batch_size = batch_size

    def open(self, context: SpoutContext) -> None:
        self._context = context

    @property
    def spark(self) -> SparkSession:
        if self._context is None:
            raise EmitError(
                f"{type(self).__name__} was not opened: call open(SpoutContext(...)) first"
            )
        return self._context.spark

    def per_task(self, count: int) -> int:
        """Of ``count`` bytes or messages, how many one task reads when they are spread
        over as many tasks as the session runs at once."""
        from transactional.spark.connect import default_parallelism

        return -(-count // default_parallelism(self.spark))

    def start_from(self, parse: Callable[[str], Any]) -> None:
        """At ``open``: take the run's start position (``--start-from``), if it was given
        one, as ``start`` (``parse`` reads the text into what ``start=`` accepts)."""
        if self._context is not None and self._context.start_from is not None:
            self.start = parse(self._context.start_from)

    def next_batch_size(self) -> int:
        """The size of a new txid: the runner's adaptive size under ``--batch-size auto``,
        else the fixed ``batch_size``. Replays never ask: their ranges are stored."""
        if self._context is None:
            return self.batch_size
        return self._context.batch_size(self.batch_size)


class HeldRanges(PartitionedTransactionalSpout[M]):
    """A partitioned spout over a source that can stop holding what a stored range names
    (Kafka's retention, a trimmed stream): a batch is its ranges read (``read``), after
    ``check_held`` has made sure the source still holds them all, so that a replay is
    exact or refused by name (``SourceDataLostError``), never short."""

    def check_held(self, attempt: TransactionAttempt, ranges: Mapping[int, M]) -> None:
        """Raise ``SourceDataLostError`` naming a range the source no longer holds whole."""
        raise NotImplementedError

    def read(self, ranges: Mapping[int, M], tagged: bool = False) -> DataFrame:
        """The records of ``ranges`` (partition -> range) as one frame; ``tagged``: each
        row with its partition in ``PARTITION_COLUMN``."""
        raise NotImplementedError

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, meta: M
    ) -> DataFrame:
        self.check_held(attempt, {partition: meta})
        return self.read({partition: meta})

    def emit_partitions(self, attempt: TransactionAttempt, metas: Mapping[int, M]) -> DataFrame:
        self.check_held(attempt, metas)
        return self.read(metas, tagged=True)


def split_frame(
    spark: SparkSession,
    rows: Sequence[tuple[Any, ...]],
    schema: str,
    reader: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    tasks: int | None = None,
    output: str | StructType = "raw STRING, error STRING",
) -> DataFrame:
    """A lazy frame that runs ``reader`` (a ``mapInArrow`` body, module-level so Spark
    can pickle it) over ``rows`` of ``schema`` (the "splits": what each task reads):
    one Spark task per row, or the rows spread over ``tasks`` tasks of consecutive rows,
    in order (each reads its rows one after the other). Its records have the ``output``
    schema.

    The frame is a range of the rows' indexes, made in the JVM; the rows travel with the
    reader, in its pickled closure, and each task takes its own by index. A frame of
    Python rows (``createDataFrame``) would pass them through a Python worker of its own
    first (a second worker process, a second Python evaluation in every task), and Spark
    Connect has no RDD to slice; as a literal in the plan, a split's text (a Redis URL's
    password) would reach what Spark logs of its plans."""
    if not rows:
        return spark.createDataFrame([], output)
    import pyarrow as pa

    types = _arrow_schema(schema)
    table = pa.Table.from_pylist(
        [dict(zip(types.names, row, strict=True)) for row in rows], schema=types
    )
    body = functools.partial(_read_by_index, table, reader)
    body.__name__ = getattr(reader, "__name__", "split_reader")  # type: ignore[attr-defined]
    count = min(len(rows), tasks or len(rows))
    return spark.range(0, len(rows), 1, count).mapInArrow(body, output)


def _read_by_index(
    table: pa.Table,
    reader: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    indexes: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """In a task: ``reader`` over the rows of ``table`` whose indexes the task holds."""

    def splits() -> Iterator[pa.RecordBatch]:
        for batch in indexes:
            yield from table.take(batch.column(0)).to_batches()

    return reader(splits())


@functools.cache
def _arrow_schema(schema: str) -> pa.Schema:
    """The DDL ``schema`` of a source's splits as Arrow types, parsed by Spark (once a
    process: each source's is a constant)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    struct = StructType.fromDDL(schema)
    assert isinstance(struct, StructType), schema
    return to_arrow_schema(struct)


def parse_start(
    text: str,
    who: str,
    key: Callable[[str], Any] | None = None,
    value: Callable[[str], Any] = int,
    single: Callable[[str], Any] | None = None,
) -> Any:
    """``--start-from`` as a source's ``start=``: ``earliest``, ``latest``, an ISO 8601
    time (``2026-11-24T10:00:00Z``: a ``datetime``), ``single`` applied to the text
    (a Delta version), or ``KEY=VALUE[,KEY=VALUE]`` (partition or file or stream to
    offset or entry id) read with ``key`` and ``value``."""
    from datetime import datetime

    text = text.strip()
    if text in ("earliest", "latest"):
        return text
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        pass
    if single is not None:
        try:
            return single(text)
        except ValueError:
            pass
    if key is not None and "=" in text:
        try:
            return {
                key(k.strip()): value(v.strip())
                for k, v in (p.rsplit("=", 1) for p in text.split(","))
            }
        except ValueError:
            pass
    forms = "earliest, latest, an ISO 8601 time"
    if single is not None:
        forms += ", a version number"
    if key is not None:
        forms += ", or POSITION=OFFSET pairs separated by commas"
    raise ConfigurationError(f"{who}: --start-from {text!r} is not a start position: give {forms}")
