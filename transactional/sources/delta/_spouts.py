"""The Delta table spout (``transactional.sources.delta`` says what it promises)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote

from pydantic import Field

from transactional.errors import (
    ConfigurationError,
    EmitError,
    SourceDataLostError,
    SourceSchemaError,
)
from transactional.lineage import Dataset, at_path
from transactional.sources.base import SourceBase, parse_start
from transactional.spark.storage import arrow_file_system, is_local, open_input
from transactional.spout import SpoutContext, TransactionalSpout
from transactional.types import BatchMetadata, TransactionAttempt

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["DeltaTableSpout", "DeltaVersions"]

DeltaStart = Literal["earliest", "latest"] | int | datetime

#: The directory of the table's log, one ``NNNN.json`` commit file per version.
_LOG = "_delta_log"


class DeltaVersions(BatchMetadata):
    """Table versions ``first`` to ``last``, both included; ``records`` the rows they
    added (appends) or changed (the change data feed), as the log counts them."""

    first: int = Field(ge=0)
    last: int = Field(ge=-1)
    records: int = Field(default=0, ge=0)

    @property
    def empty(self) -> bool:
        return self.last < self.first


class _Version:
    """One commit of the table's log, as far as a source needs it."""

    def __init__(self, number: int, actions: list[dict[str, Any]]) -> None:
        self.number = number
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        self.operation = str(info.get("operation", "an unnamed operation"))
        self.timestamp = int(info.get("timestamp", 0))
        self.adds = [a["add"] for a in actions if "add" in a and a["add"].get("dataChange", True)]
        self.changes = [
            a["remove"] for a in actions if "remove" in a and a["remove"].get("dataChange", True)
        ]
        self.cdc = [a["cdc"] for a in actions if "cdc" in a]
        self.schema = next(
            (a["metaData"].get("schemaString") for a in actions if "metaData" in a), None
        )

    def records(self, change_data_feed: bool) -> int | None:
        """Rows this version adds (or, with the change data feed, the change rows of
        its ``cdc`` files, else of its adds and removes); None if the log lacks counts."""
        files = self.adds if not change_data_feed else (self.cdc or self.adds + self.changes)
        total = 0
        for action in files:
            stats = action.get("stats")
            if not stats:
                return None
            count = json.loads(stats).get("numRecords")
            if count is None:
                return None
            total += int(count)
        return total


class DeltaTableSpout(SourceBase, TransactionalSpout[DeltaVersions]):
    """A Delta table's versions as one stream of batches."""

    #: What stores hold for this class (``identity``); never changes.
    stored_name = "transactional.sources.delta.DeltaTableSpout"

    metadata_type = DeltaVersions

    def __init__(
        self,
        path: str | os.PathLike[str],
        batch_size: int = 100_000,
        start: DeltaStart = "earliest",
        change_data_feed: bool = False,
    ) -> None:
        super().__init__(batch_size)
        who = type(self).__name__
        if isinstance(start, str) and start not in ("earliest", "latest"):
            raise ConfigurationError(
                f"{who}: start must be 'earliest', 'latest', a version number or a "
                f"datetime, not {start!r}"
            )
        if isinstance(start, int) and not isinstance(start, bool) and start < 0:
            raise ConfigurationError(f"{who}: start version must be 0 or more, not {start}")
        location = os.fspath(path)
        #: A local path made absolute, or an S3 URL as given (``transactional.spark.storage``).
        self.path = str(Path(location).resolve()) if "://" not in location else location.rstrip("/")
        arrow_file_system(self.path, who)  # any other URL: refused now
        self.start = start
        self.change_data_feed = change_data_feed
        self._begin = 0  # the first version of a fresh topology, fixed at open
        self._schema: str | None = None  # the schema the records have
        self._versions: dict[int, _Version] = {}
        self._behind: int | None = None

    @property
    def who(self) -> str:
        return type(self).__name__

    def identity(self) -> str:
        mode = "cdf" if self.change_data_feed else "appends"
        return f"{self.stored_name}:{mode}:{self.path}"

    def lineage_datasets(self) -> Sequence[Dataset]:
        return (at_path(self.path),)

    def open(self, context: SpoutContext) -> None:
        super().open(context)
        self.start_from(lambda text: parse_start(text, self.who, single=int))
        if isinstance(self.start, int) and self.start < 0:
            raise ConfigurationError(
                f"{self.who}: start version must be 0 or more, not {self.start}"
            )
        latest = self.latest()
        if latest < 0:
            raise ConfigurationError(
                f"{self.who}: {self.path} is not a Delta table (no {_LOG}/ with a commit): "
                "create the table first, or fix the path"
            )
        self._begin = self._beginning(latest)
        self._schema = self._schema_at(min(self._begin, latest))
        if self.change_data_feed and not self._feed_enabled(latest):
            raise ConfigurationError(
                f"{self.who}: {self.path} does not record its change data feed: set the "
                "table property delta.enableChangeDataFeed = true (ALTER TABLE ... SET "
                "TBLPROPERTIES), or read appends only (change_data_feed=False)"
            )

    def lag(self) -> int | None:
        """Versions committed after the last txid's, at the last look."""
        return self._behind

    def spark_conf(self) -> Mapping[str, str]:
        """For a table in S3, Spark's ``s3a`` connector (``transactional.spark.storage``);
        Delta's own jars come with the session (``committers.delta_spark_conf``)."""
        if is_local(self.path):
            return {}
        from transactional.spark.storage import s3_spark_conf

        return s3_spark_conf()

    # -- the log --------------------------------------------------------------------

    def latest(self) -> int:
        """The newest version, from the names of the log's commit files (-1: none), listed
        on the local file system or in the bucket."""
        import pyarrow.fs as pa_fs

        fs, log = arrow_file_system(f"{self.path}/{_LOG}", self.who)
        try:
            listed = fs.get_file_info(pa_fs.FileSelector(log, allow_not_found=True))
        except OSError as e:
            raise EmitError(f"{self.who}: cannot list {self.path}/{_LOG}: {e}") from e
        names = [info.base_name for info in listed]
        numbers = [int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()]
        return max(numbers, default=-1)

    def version(self, number: int) -> _Version:
        known = self._versions.get(number)
        if known is not None:
            return known
        name = f"{number:020d}.json"
        try:
            with open_input(f"{self.path}/{_LOG}/{name}") as f:
                text = f.read().decode("utf-8")
        except FileNotFoundError as e:
            raise SourceDataLostError(
                f"{self.who}: version {number} of {self.path} is no longer in its log "
                f"({name} is gone: log retention or a deleted table), so the batch "
                "that reads it cannot be read; keep the log longer than a txid takes"
            ) from e
        except OSError as e:
            raise EmitError(f"{self.who}: cannot read {name} of {self.path}: {e}") from e
        actions = [json.loads(line) for line in text.splitlines() if line.strip()]
        version = _Version(number, actions)
        if len(self._versions) > 4096:
            self._versions.clear()
        self._versions[number] = version
        return version

    def _schema_at(self, number: int) -> str | None:
        from deltalake import DeltaTable

        try:
            return DeltaTable(self.path, version=number).schema().to_json()
        except Exception as e:  # delta-rs raises its own error kinds
            raise EmitError(f"{self.who}: cannot read version {number} of {self.path}: {e}") from e

    def _feed_enabled(self, number: int) -> bool:
        from deltalake import DeltaTable

        config = DeltaTable(self.path, version=number).metadata().configuration
        return str(config.get("delta.enableChangeDataFeed", "false")).lower() == "true"

    def _beginning(self, latest: int) -> int:
        start = self.start
        if start == "earliest":
            return 0
        if start == "latest":
            return latest + 1
        if isinstance(start, datetime):
            millis = int(start.timestamp() * 1000)
            for number in range(latest + 1):
                if self.version(number).timestamp >= millis:
                    return number
            return latest + 1
        assert isinstance(start, int)
        if start > latest + 1:
            raise ConfigurationError(
                f"{self.who}: start version {start} is beyond the table's newest, {latest}"
            )
        return start

    # -- deciding versions -------------------------------------------------------------

    def _next(self, prev: DeltaVersions | None) -> int:
        return prev.last + 1 if prev is not None else self._begin

    def is_ready(self, txid: int, prev_meta: DeltaVersions | None) -> bool:
        latest = self.latest()
        self._behind = max(0, latest - self._next(prev_meta) + 1)
        return latest >= self._next(prev_meta)

    def initialize_transaction(self, txid: int, prev_meta: DeltaVersions | None) -> DeltaVersions:
        first = self._next(prev_meta)
        latest = self.latest()
        budget = self.next_batch_size()
        last, records = first - 1, 0
        while last < latest:
            version = self.version(last + 1)
            count = version.records(self.change_data_feed)
            if last >= first and (count is None or records + count > budget):
                break
            self._check(version)
            last, records = last + 1, records + (count or 0)
            if count is None:
                break  # no counts in the log: one version per txid
        self._behind = max(0, latest - last)
        return DeltaVersions(first=first, last=last, records=records)

    def _check(self, version: _Version) -> None:
        if version.schema is not None and version.schema != self._schema:
            raise SourceSchemaError(
                f"{self.who}: version {version.number} of {self.path} ({version.operation}) "
                "changes the table's schema, so its records would not have the schema of "
                f"those before; start a new topology id at version {version.number} "
                f"(start={version.number}) to read on with the new schema"
            )
        if not self.change_data_feed and version.changes:
            raise SourceSchemaError(
                f"{self.who}: version {version.number} of {self.path} is a "
                f"{version.operation} that changes or deletes rows, which appends cannot "
                "carry: enable the table's change data feed (delta.enableChangeDataFeed) "
                "and read it with change_data_feed=True"
            )

    # -- reading --------------------------------------------------------------------

    @property
    def _spark_path(self) -> str:
        """The table as Spark names it: ``s3a://`` for a table in S3 (Hadoop's
        connector), the path itself for a local one."""
        if is_local(self.path):
            return self.path
        return "s3a://" + self.path.split("://", 1)[1]

    def emit_batch(self, attempt: TransactionAttempt, meta: DeltaVersions) -> DataFrame:
        if self.change_data_feed:
            return self._changes(meta)
        frames = list(self._appends(meta))
        if not frames:
            return self._empty()
        frame = frames[0]
        for more in frames[1:]:
            frame = frame.unionByName(more)
        return frame

    def _appends(self, meta: DeltaVersions) -> Iterator[DataFrame]:
        """Per version that added rows: the rows of its files, read in that version."""
        from pyspark.sql import functions as F

        for number in range(meta.first, meta.last + 1):
            version = self.version(number)
            names = [os.path.basename(unquote(a["path"])) for a in version.adds]
            if not names:
                continue
            table = (
                self.spark.read.format("delta").option("versionAsOf", number).load(self._spark_path)
            )
            yield table.where(F.col("_metadata.file_name").isin(names))

    def _changes(self, meta: DeltaVersions) -> DataFrame:
        if meta.empty:
            return self._empty()
        return (
            self.spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", meta.first)
            .option("endingVersion", meta.last)
            .load(self._spark_path)
        )

    def _empty(self) -> DataFrame:
        """No rows, in the schema a batch of this source has."""
        frame = self.spark.read.format("delta").load(self._spark_path).limit(0)
        if self.change_data_feed:
            from pyspark.sql import functions as F

            frame = frame.select(
                "*",
                F.lit(None).cast("string").alias("_change_type"),
                F.lit(None).cast("long").alias("_commit_version"),
                F.lit(None).cast("timestamp").alias("_commit_timestamp"),
            )
        return frame

    def sample_batch(self) -> DataFrame | None:
        """A few rows of the table as it is (the runner's warm-up)."""
        if self.change_data_feed:
            return None
        return self.spark.read.format("delta").load(self._spark_path).limit(256)
