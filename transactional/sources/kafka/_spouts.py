"""The Kafka spouts (``transactional.sources.kafka`` says what they promise)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from transactional.errors import ConfigurationError, EmitError, SourceDataLostError
from transactional.lineage import Dataset, in_kafka
from transactional.sources.base import HeldRanges, SourceBase, parse_start
from transactional.sources.kafka._direct import DirectRead
from transactional.sources.kafka._offsets import Isolation, KafkaOffsets, Snapshot
from transactional.sources.text import text_records
from transactional.spark.connect import client_only
from transactional.spark.jars import session_jars
from transactional.spout import (
    PARTITION_COLUMN,
    OpaquePartitionedTransactionalSpout,
    SpoutContext,
)
from transactional.types import BatchMetadata, TransactionAttempt

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import DataFrame

__all__ = [
    "KafkaOpaqueSpout",
    "KafkaPartitionedSpout",
    "KafkaRange",
    "kafka_package",
    "kafka_spark_conf",
]

Start = Literal["earliest", "latest"] | Mapping[int, int] | datetime

#: Spark's Kafka reader warns at every read given ``kafka.group.id`` (each txid).
GROUP_LOGGER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"

#: The ``error`` of a text record whose Kafka record has no value.
TOMBSTONE = "no value (a tombstone)"
#: Columns of a text record batch after ``raw, error``.
TEXT_COLUMNS = ("key", "topic", "partition", "offset", "timestamp")
TEXT_SCHEMA = (
    "raw STRING, error STRING, key BINARY, topic STRING, partition INT, offset LONG, "
    "timestamp TIMESTAMP"
)
BINARY_SCHEMA = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset LONG, "
    "timestamp TIMESTAMP, timestampType INT, error STRING"
)


def kafka_package() -> str:
    """The Maven coordinate of Spark's Kafka reader for the installed PySpark."""
    import pyspark

    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def kafka_spark_conf(ivy_dir: str | Path | None = None) -> dict[str, str]:
    """Spark settings that load the Kafka reader (its jars, resolved once from Maven
    Central); merge them into the session's with ``transactional.spark.session.merged``. None
    with PySpark's Connect client alone: the server has its own."""
    if client_only():
        return {}
    return {"spark.jars": ",".join(str(jar) for jar in session_jars([kafka_package()], ivy_dir))}


class KafkaRange(BatchMetadata):
    """Offsets ``[start, end)`` of one partition; ``lost`` offsets before ``start`` were
    deleted before they were read (opaque spout only)."""

    start: int = Field(ge=0)
    end: int = Field(ge=0)
    lost: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> KafkaRange:
        if self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")
        return self

    @property
    def offsets(self) -> int:
        return self.end - self.start


class _KafkaTopic(SourceBase):
    """One topic: its offsets asked on the driver (``KafkaOffsets``), its records read
    by Spark."""

    #: A range of offsets may hold no record (compaction, transaction markers) and still
    #: be needed to move on: such a txid commits.
    commit_empty_batches: ClassVar[bool] = True
    #: A record's place in the topic (a gap's row names the first offset lost, which no
    #: record of the batch has): its ledger id (``transactional.ledger``).
    position_columns: ClassVar[tuple[str, ...]] = ("partition", "offset")

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        batch_size: int = 10_000,
        start: Start = "earliest",
        value_format: Literal["text", "binary"] = "text",
        isolation_level: Isolation = "read_committed",
        options: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        super().__init__(batch_size)
        who = type(self).__name__
        if value_format not in ("text", "binary"):
            raise ConfigurationError(
                f"{who}: value_format must be 'text' or 'binary', not {value_format!r}"
            )
        if isinstance(start, str) and start not in ("earliest", "latest"):
            raise ConfigurationError(
                f"{who}: start must be 'earliest', 'latest', a mapping of partition to "
                f"offset or a datetime, not {start!r}"
            )
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.start = start
        self.value_format = value_format
        self.isolation_level = isolation_level
        #: More options for Spark's Kafka reader (``kafka.security.protocol``, ...) and,
        #: without their ``kafka.`` prefix, for the driver's admin client.
        self.options = dict(options or {})
        self.offsets = KafkaOffsets(
            who,
            bootstrap_servers,
            topic,
            isolation_level,
            {
                k.removeprefix("kafka."): v
                for k, v in self.options.items()
                if k.startswith("kafka.")
            },
            timeout_s,
        )
        #: Options of every read: ``options`` and the topology's consumer group.
        self._reader_options = dict(self.options)
        #: Reads without a Kafka relation planned each txid, where the session allows.
        self._direct: DirectRead | None = None
        self._fresh = False  # no partition had a range when the current txid began
        #: Offsets each partition held beyond the last range decided, at the last look.
        self._behind: dict[int, int] = {}

    def identity(self) -> str:
        return f"{self.stored_name}:{self.topic}"

    def lineage_datasets(self) -> Sequence[Dataset]:
        return (in_kafka(self.bootstrap_servers, self.topic),)

    def spark_conf(self) -> Mapping[str, str]:
        return kafka_spark_conf()

    def preflight(self) -> None:
        """The broker answers and the topic exists, asked with a short timeout."""
        self.offsets.count(at_open=True, timeout_s=min(self.offsets.timeout_s, 4.0))

    def open(self, context: SpoutContext) -> None:
        super().open(context)
        self.start_from(lambda text: parse_start(text, type(self).__name__, key=int, value=int))
        _check_reader(self.spark, type(self).__name__)
        # One consumer group for every read of the topology: Spark's reader keeps its
        # consumers pooled by group and partition, so a txid's tasks take up the
        # consumers (and the records they fetched ahead) of the txid before, where a
        # group of its own per read (Spark's default) connects anew every txid: 125 ms
        # against 78 ms a read of 1,000 records (benchmarks/analysis.md). Safe for a
        # reader that assigns partitions and commits no offsets: it never joins the group.
        if not {"kafka.group.id", "groupIdPrefix"} & self.options.keys():
            group = f"transactional-{context.topology_id}"
            self._reader_options = {"kafka.group.id": group, **self.options}
            _quiet_group_warning(self.spark)
        self._direct = self._direct_read()
        self.offsets.count(at_open=True)

    def _direct_read(self) -> DirectRead | None:
        """The direct read (``_direct.py``) on a classic session, its options checked
        first by Spark's reader, which refuses the ones it would refuse at every read."""
        from transactional.spark.connect import is_connect

        if is_connect(self.spark):
            return None
        from pyspark.errors.exceptions.captured import CapturedException

        who = type(self).__name__
        try:
            self._reader({0: KafkaRange(start=0, end=0)})
        except CapturedException as e:
            raise ConfigurationError(
                f"{who}: Spark's Kafka reader refuses the options {sorted(self.options)}: "
                f"{' '.join(str(e).split())} Change them"
            ) from None
        return DirectRead.of(self.spark, self._read_options(), who)

    def close(self) -> None:
        self.offsets.close()

    def num_partitions(self) -> int:
        return self.offsets.count()

    # -- deciding ranges ------------------------------------------------------------

    def is_ready(self, txid: int, last_metas: Mapping[int, KafkaRange]) -> bool:
        self._fresh = not last_metas
        count = self.offsets.counted()
        unread = [p for p in range(count) if p not in last_metas]
        snapshot = self.offsets.snap(txid, count, unread)
        # A partition never read is ready once it holds anything (its start is decided
        # with its first range: an empty topic leaves no txid behind).
        starts = {**{p: m.end for p, m in last_metas.items()}, **snapshot.starts}
        self._behind = {p: max(0, end - starts[p]) for p, end in snapshot.ends.items()}
        return any(end > starts[p] for p, end in snapshot.ends.items())

    def lag(self) -> int | None:
        """Offsets the topic held beyond the last txid's ranges when it was decided."""
        behind = self._behind
        return sum(behind.values()) if behind else None

    def starting(self, partition: int, snapshot: Snapshot) -> int:
        """Where a partition without a range starts: ``start`` for the partitions of a
        fresh topology, the earliest offset for one added later."""
        earliest = self.offsets.starts(snapshot, [partition])[partition]
        start = self.start
        if not self._fresh or start == "earliest":
            return earliest
        if start == "latest":
            return snapshot.ends[partition]
        if isinstance(start, datetime):
            at = self.offsets.at_time(partition, int(start.timestamp() * 1000))
            return at if at >= 0 else snapshot.ends[partition]
        assert isinstance(start, Mapping)
        offset = int(start.get(partition, earliest))
        if offset < earliest:
            raise SourceDataLostError(
                f"{type(self).__name__}: start offset {offset} of {self.topic!r} partition "
                f"{partition} was deleted (the partition now starts at {earliest}): start "
                "from an offset that still exists"
            )
        return offset

    def next_range(
        self, attempt: TransactionAttempt, partition: int, last: KafkaRange | None
    ) -> KafkaRange:
        """The range after ``last``, up to the partition's end as the attempt's snapshot
        saw it."""
        snapshot = self.offsets.for_attempt(attempt, partition)
        start = last.end if last is not None else self.starting(partition, snapshot)
        end = snapshot.ends[partition]
        if end < start:
            raise EmitError(
                f"{type(self).__name__}: {self.topic!r} partition {partition} ends at "
                f"offset {end}, before {start} where its last batch ended: the topic was "
                "deleted and created again; start a new topology id"
            )
        taken = KafkaRange(start=start, end=min(end, start + self.next_batch_size()))
        self._behind = {**self._behind, partition: end - taken.end}
        return taken

    # -- reading --------------------------------------------------------------------

    def read(self, ranges: Mapping[int, KafkaRange], tagged: bool = False) -> DataFrame:
        """The records of ``ranges`` (partition -> range) as one frame, by Spark's Kafka
        reader; ``tagged``: with each row's partition in ``PARTITION_COLUMN``."""
        from pyspark.sql import functions as F

        wanted = {p: r for p, r in sorted(ranges.items()) if r.offsets}
        schema = TEXT_SCHEMA if self.value_format == "text" else BINARY_SCHEMA
        if tagged:
            schema += f", {PARTITION_COLUMN} INT"
        gaps = [self._gap(p, r, tagged) for p, r in sorted(ranges.items()) if r.lost]
        if not wanted:
            return self.spark.createDataFrame(gaps, schema)
        if self._direct is not None:
            bounds = {p: (r.start, r.end) for p, r in wanted.items()}
            frame = self._direct.frame(self.topic, bounds)
        else:
            frame = self._reader(wanted)
        if self.value_format == "text":
            # A record without a value (a tombstone) is not text: say so.
            frame = text_records(frame, "value", TEXT_COLUMNS, TOMBSTONE, kept_last=True)
        else:
            frame = frame.withColumn("error", F.lit(None).cast("string"))
        if tagged:
            frame = frame.withColumn(PARTITION_COLUMN, F.col("partition"))
        if gaps:
            frame = frame.unionByName(self.spark.createDataFrame(gaps, schema))
        return frame

    def _read_options(self) -> dict[str, str]:
        """What a read is given beside its ranges."""
        return {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "kafka.isolation.level": self.isolation_level,
            "failOnDataLoss": "true",
            **self._reader_options,
        }

    def _reader(self, ranges: Mapping[int, KafkaRange]) -> DataFrame:
        """``ranges`` as Spark's Kafka reader reads them (a relation planned for them)."""
        topic = self.topic
        return (
            self.spark.read.format("kafka")
            .option("assign", json.dumps({topic: list(ranges)}))
            .option(
                "startingOffsets", json.dumps({topic: {str(p): r.start for p, r in ranges.items()}})
            )
            .option(
                "endingOffsets", json.dumps({topic: {str(p): r.end for p, r in ranges.items()}})
            )
            .options(**self._read_options())
            .load()
        )

    def _gap(self, partition: int, r: KafkaRange, tagged: bool) -> tuple[Any, ...]:
        """The row that stands for offsets deleted before they were read."""
        error = (
            f"offsets {r.start - r.lost} to {r.start - 1} of {self.topic!r} partition "
            f"{partition} were deleted (retention) before they were read: {r.lost} offsets lost"
        )
        row: tuple[Any, ...]
        if self.value_format == "text":
            row = ("", error, None, self.topic, partition, r.start - r.lost, None)
        else:
            row = (None, None, self.topic, partition, r.start - r.lost, None, None, error)
        return (*row, partition) if tagged else row

    def check_held(self, attempt: TransactionAttempt, ranges: Mapping[int, KafkaRange]) -> None:
        """A replayable range must still be in the topic: say which one is not, instead
        of failing every attempt inside Spark's reader."""
        held = {p: r for p, r in ranges.items() if r.offsets}
        if not held:
            return
        earliest = self.offsets.earliest(held)
        for p, r in held.items():
            if earliest[p] > r.start:
                raise SourceDataLostError(
                    f"{type(self).__name__}: txid {attempt.txid} reads offsets {r.start} to "
                    f"{r.end - 1} of {self.topic!r} partition {p}, but the partition now starts "
                    f"at {earliest[p]}: retention deleted them before the txid committed, so it "
                    "cannot be replayed exactly. Keep data longer than a txid can take to "
                    "commit, or use KafkaOpaqueSpout with an opaque committer"
                )


class KafkaPartitionedSpout(_KafkaTopic, HeldRanges[KafkaRange]):
    """A topic's partitions, ``batch_size`` offsets per partition per txid, replayed
    exactly from the stored ranges."""

    #: What stores hold for this class (``identity``); never changes.
    stored_name = "transactional.sources.kafka.KafkaPartitionedSpout"

    metadata_type = KafkaRange

    def emit_partition_batch_new(
        self, attempt: TransactionAttempt, partition: int, last_meta: KafkaRange | None
    ) -> KafkaRange:
        return self.next_range(attempt, partition, last_meta)


class KafkaOpaqueSpout(_KafkaTopic, OpaquePartitionedTransactionalSpout[KafkaRange]):
    """A topic's partitions for opaque committers: each batch starts where the last
    committed one ended, or at the partition's earliest offset if retention deleted
    those offsets first (the batch then carries a row naming the lost offsets)."""

    #: What stores hold for this class (``identity``); never changes.
    stored_name = "transactional.sources.kafka.KafkaOpaqueSpout"

    metadata_type = KafkaRange

    def emit_partition_batch(
        self, attempt: TransactionAttempt, partition: int, last_meta: KafkaRange | None
    ) -> tuple[KafkaRange, DataFrame]:
        meta = self.next_range(attempt, partition, last_meta)
        snapshot = self.offsets.for_attempt(attempt, partition)
        earliest = self.offsets.starts(snapshot, range(len(snapshot.ends)))[partition]
        if earliest > meta.start:
            end = snapshot.ends[partition]
            meta = KafkaRange(
                start=earliest,
                end=min(end, earliest + self.next_batch_size()),
                lost=earliest - meta.start,
            )
            self._behind = {**self._behind, partition: end - meta.end}
        return meta, self.read({partition: meta})


def _check_reader(spark: Any, who: str) -> None:
    """The session must have Spark's Kafka reader: say how to get it, at ``open``."""
    from transactional.spark.connect import is_connect

    if is_connect(spark):
        found = _server_reads_kafka(spark)
    else:
        from py4j.protocol import Py4JJavaError

        jvm = spark._jvm
        try:
            jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
                "kafka", spark._jsparkSession.sessionState().conf()
            )
            found = True
        except Py4JJavaError:
            found = False
    if found:
        return
    if is_connect(spark):
        raise ConfigurationError(
            f"{who}: the Spark Connect server has no Kafka reader ({kafka_package()}): "
            "start it with the jars of transactional.sources.kafka.kafka_spark_conf() "
            "(its spark.jars)"
        )
    raise ConfigurationError(
        f"{who}: this Spark session has no Kafka reader ({kafka_package()}): create it "
        "with the settings of transactional.sources.kafka.kafka_spark_conf() "
        "(`transactional run` adds them for a factory that takes no session)"
    )


def _quiet_group_warning(spark: Any) -> None:
    """Spark's reader warns at every read that a ``kafka.group.id`` is unsafe for queries
    that subscribe (their consumers would share the group's assignments): not so for the
    spout's reads, which assign partitions. Its logger is set to errors only, on a
    classic session (a Spark Connect server's logs are its own)."""
    from transactional.spark.connect import is_connect

    if is_connect(spark):
        return
    jvm = spark._jvm
    level = jvm.org.apache.logging.log4j.Level.ERROR
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(GROUP_LOGGER, level)


def _server_reads_kafka(spark: Any) -> bool:
    """Whether a Spark Connect server knows the ``kafka`` source: asked for a reader
    with no options, it says which option is missing if it does, and that it cannot
    find the source if not."""
    try:
        spark.read.format("kafka").load().schema  # noqa: B018 - analysed on the server
    except Exception as e:
        return "DATA_SOURCE_NOT_FOUND" not in str(e) and "Failed to find data source" not in str(e)
    return True
