"""A file or a directory of files, seen from the driver, for the file spouts
(``transactional.sources.files``, whose docstring gives the rules): which files there
are, how far each reaches, where a topology starts in them, and the lazy frames of
their ranges, whose reading runs in Spark tasks.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from transactional.errors import ConfigurationError, EmitError
from transactional.lineage import Dataset, at_path
from transactional.sources.base import SourceBase, parse_start, split_frame
from transactional.sources.files import _lines as lines
from transactional.sources.files import _parquet as parquet
from transactional.sources.files import _parse as parse
from transactional.spark.storage import arrow_file_system, file_info, open_input
from transactional.spout import PARTITION_COLUMN, SpoutContext
from transactional.types import BatchMetadata

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

__all__ = ["DEFAULT_SPLIT_BYTES", "DEFAULT_SPLIT_ROWS", "SAMPLE_LINES", "FileInput", "FileRange"]

FileFormat = Literal["jsonl", "csv", "parquet"]
FileStart = Literal["earliest", "latest"] | Mapping[str, int] | datetime

#: Bytes of a text range per Spark task.
DEFAULT_SPLIT_BYTES = 32 << 20
#: Rows of a Parquet range per Spark task.
DEFAULT_SPLIT_ROWS = 1_000_000
#: Records of a spout's sample batch (the runner's warm-up).
SAMPLE_LINES = 256

_TEXT_SPLIT_SCHEMA = "path STRING, start LONG, end LONG, lo LONG, hi LONG"


class FileRange(BatchMetadata):
    """``count`` records of ``file`` (a name inside the directory, or the file's own
    name): bytes ``[offset, offset + length)`` of a text file, rows of a Parquet file
    (where ``length == count``)."""

    file: str
    offset: int = Field(ge=0)
    length: int = Field(ge=0)
    count: int = Field(ge=0)

    @property
    def end(self) -> int:
        return self.offset + self.length


#: How many of a record's places its name lists (a text on many lines: the first ones).
_PLACES = 3


def _place(places: Sequence[tuple[str, int]], unit: str, same: str) -> str:
    """A record's places, ``(file, line or row)`` in the ranges' order, as the ledger
    names it: ``file a.jsonl line 7``, ``file a.jsonl line 7, 12 or file b.jsonl line 3
    (same text)``, ``... or 9 more (same text)``."""

    def file(name: str) -> str:
        return repr(name) if not name or " " in name else name

    shown = [
        f"file {file(name)} {unit} {n}" if i == 0 or places[i - 1][0] != name else str(n)
        for i, (name, n) in enumerate(places[:_PLACES])
    ]
    if len(places) == 1:
        return shown[0]
    more = len(places) - _PLACES
    last = f"{more} more" if more > 0 else shown.pop()
    return f"{', '.join(shown)} or {last} (same {same})"


class FileInput(SourceBase):
    """A file or a directory of files, seen from the driver."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        batch_size: int = 1000,
        format: FileFormat = "jsonl",
        schema: str | StructType | None = None,
        header: bool = False,
        options: Mapping[str, str] | None = None,
        start: FileStart = "earliest",
        split_bytes: int = DEFAULT_SPLIT_BYTES,
        split_rows: int = DEFAULT_SPLIT_ROWS,
    ) -> None:
        super().__init__(batch_size)
        who = type(self).__name__
        if format not in ("jsonl", "csv", "parquet"):
            raise ConfigurationError(
                f"{who}: format must be 'jsonl', 'csv' or 'parquet', not {format!r}"
            )
        if format == "csv" and schema is None:
            raise ConfigurationError(
                f"{who}: a CSV source needs schema= (a DDL string such as "
                "'account STRING, amount LONG' or a StructType): CSV does not say its types"
            )
        if header and format != "csv":
            raise ConfigurationError(f"{who}: header=True is for format='csv', not {format!r}")
        if isinstance(start, str) and start not in ("earliest", "latest"):
            raise ConfigurationError(
                f"{who}: start must be 'earliest', 'latest', a mapping of file name to "
                f"offset or a datetime, not {start!r}"
            )
        location = os.fspath(path)
        #: A local path made absolute, or an S3 URL as given (``storage``).
        self.path = str(Path(location).resolve()) if "://" not in location else location.rstrip("/")
        arrow_file_system(self.path, type(self).__name__)  # any other URL: refused now
        self._is_dir: bool | None = None
        self.format = format
        self.header = header
        self.options = dict(options or {})
        self.start = start
        self.split_bytes = split_bytes
        self.split_rows = split_rows
        #: The schema as given; parsed at ``open`` (a DDL string needs the JVM).
        self.schema_given = schema
        self.schema: StructType | None = None
        self._rows: dict[str, tuple[int, int, int]] = {}  # name -> (size, mtime, rows)
        self._data_starts: dict[str, int] = {}
        self._checked: dict[str, tuple[int, int]] = {}  # Parquet files whose schema fits
        self._at_open: dict[str, int] = {}  # name -> size (or rows) when opened
        self._fresh = False
        #: Per file, what it held beyond the last range decided, at the last look.
        self._behind: dict[str, int] = {}
        #: The range of the last ``sample_batch`` (the warm-up's txid 0), for ``locate``.
        self._sample: list[FileRange] = []

    def identity(self) -> str:
        # The input is part of the identity: offsets stored for one input (or format)
        # mean nothing for another, so reusing a topology id with other files is refused.
        return f"{self.stored_name}:{self.format}:{self.path}"

    def lineage_datasets(self) -> Sequence[Dataset]:
        return (at_path(self.path),)

    def open(self, context: SpoutContext) -> None:
        super().open(context)
        self.start_from(lambda text: parse_start(text, self.who, key=str, value=int))
        names = self.names()
        if self.schema_given is not None:
            self.schema = parse.struct(self.schema_given, self.who, self.format != "parquet")
        elif self.format == "parquet":
            if not names:
                raise ConfigurationError(
                    f"{self.who}: {self.path} holds no Parquet file to take the schema from: "
                    "pass schema= or start once a file exists"
                )
            self.schema = parquet.schema_of(self.who, self.resolve(names[0]))
        self._at_open = {name: self.size(name) for name in names}
        self._check_start(names)

    def lag(self) -> int | None:
        """Bytes (Parquet: rows) the files held beyond the last txid's ranges when it
        was decided."""
        behind = self._behind
        return sum(behind.values()) if behind else None

    # -- the files --------------------------------------------------------------------

    @property
    def who(self) -> str:
        return type(self).__name__

    def names(self) -> list[str]:
        """The files' names, sorted, asked of the local file system or the bucket
        (pyarrow's file systems); names starting with ``.`` or ``_`` are left out."""
        import pyarrow.fs as pa_fs

        fs, root = arrow_file_system(self.path, self.who)
        try:
            if self._is_dir is None:
                kind = fs.get_file_info(root).type
                if kind not in (pa_fs.FileType.Directory, pa_fs.FileType.File):
                    raise ConfigurationError(
                        f"{self.who}: {self.path} does not exist: give the path of a "
                        f"{self.format} file or of a directory of them"
                    )
                self._is_dir = kind == pa_fs.FileType.Directory
            if not self._is_dir:
                return [root.rsplit("/", 1)[-1]]
            listed = fs.get_file_info(pa_fs.FileSelector(root))
        except OSError as e:
            raise EmitError(f"{self.who}: cannot list {self.path}: {e}") from e
        return sorted(
            info.base_name
            for info in listed
            if info.type == pa_fs.FileType.File and not info.base_name.startswith((".", "_"))
        )

    def resolve(self, name: str) -> str:
        if self._is_dir is None:
            self.names()
        return f"{self.path}/{name}" if self._is_dir else self.path

    def size(self, name: str) -> int:
        """Bytes of a text file; rows of a Parquet file (from its footer, read again only
        when the file's size or time changed)."""
        path = self.resolve(name)
        try:
            stat = file_info(path)
        except OSError as e:
            raise EmitError(f"{self.who}: cannot read {path}: {e.strerror or e}") from e
        if self.format != "parquet":
            return stat.size
        known = self._rows.get(name)
        if known is not None and known[:2] == stat:
            return known[2]
        try:
            rows = parquet.row_count(path)
        except (OSError, ValueError) as e:
            raise EmitError(
                f"{self.who}: {path} is not a readable Parquet file ({e}); write Parquet "
                "files under a name starting with '.' or '_' and rename them when complete"
            ) from e
        self._rows[name] = (*stat, rows)
        return rows

    def data_start(self, name: str) -> int:
        """Where a file's records begin: after the header line of a CSV file with one,
        else 0. The header is checked against the schema the first time."""
        if not self.header:
            return 0
        if name not in self._data_starts:
            path = self.resolve(name)
            length, count = lines.scan_lines(path, 0, 1)
            if not count:
                return 0  # no header yet: nothing to read either
            with open_input(path) as f:
                line = f.read(length).rstrip(b"\n").rstrip(b"\r")
            assert self.schema is not None
            parse.check_header(self.who, path, line, self.schema, self.options)
            self._data_starts[name] = length
        return self._data_starts[name]

    def scan(self, name: str, offset: int, max_records: int) -> tuple[int, int]:
        """``(length, count)`` of the next up to ``max_records`` records of ``name``."""
        size = self.size(name)
        offset = max(offset, self.data_start(name))
        if size < offset:
            unit = "rows" if self.format == "parquet" else "bytes"
            raise EmitError(
                f"{self.who}: {self.resolve(name)} has {size} {unit} but {offset} were already "
                "read: it was truncated or replaced; files may only grow by appending lines "
                "(Parquet files never change)"
            )
        if self.format == "parquet":
            count = min(max_records, size - offset)
            return count, count
        try:
            return lines.scan_lines(self.resolve(name), offset, max_records)
        except OSError as e:
            raise EmitError(f"{self.who}: cannot read {self.resolve(name)}: {e}") from e

    def take(self, name: str, offset: int, max_records: int) -> FileRange:
        if self.format == "parquet":
            self._check_parquet(name)
        offset = max(offset, self.data_start(name))
        length, count = self.scan(name, offset, max_records)
        self._behind = {**self._behind, name: max(0, self.size(name) - offset - length)}
        return FileRange(file=name, offset=offset, length=length, count=count)

    # -- start positions ----------------------------------------------------------------

    def start_of(self, name: str) -> int:
        """Where a file without a range starts: ``start`` for the files of a fresh
        topology that existed at open, the file's beginning for any other."""
        begin = self.data_start(name)
        start = self.start
        if not self._fresh or start == "earliest" or name not in self._at_open:
            return begin
        if start == "latest":
            return max(begin, self._at_open[name])
        if isinstance(start, datetime):
            modified = file_info(self.resolve(name)).mtime_ns / 1e9
            return max(begin, self._at_open[name]) if modified < start.timestamp() else begin
        return max(begin, int(start.get(name, begin)))

    def _check_start(self, names: list[str]) -> None:
        if not isinstance(self.start, Mapping):
            return
        for name, offset in self.start.items():
            if name not in names:
                raise ConfigurationError(
                    f"{self.who}: start names {name!r}, which is not a file of {self.path} "
                    f"(it holds {', '.join(names) or 'no file'})"
                )
            size = self.size(name)
            if not 0 <= offset <= size:
                raise ConfigurationError(
                    f"{self.who}: start offset {offset} of {name!r} is outside the file "
                    f"(0 to {size})"
                )
            if (
                self.format != "parquet"
                and offset
                and not lines.at_line_start(self.resolve(name), offset)
            ):
                raise ConfigurationError(
                    f"{self.who}: start offset {offset} of {name!r} is not the start of a "
                    "line: give the byte offset just after a newline"
                )

    # -- reading --------------------------------------------------------------------

    def read_ranges(
        self,
        ranges: Iterable[tuple[str, int, int]],
        split: int | None = None,
        finished: Collection[str] = (),
    ) -> DataFrame:
        """A lazy frame of the ``(file, offset, length)`` ranges, in order, a task per
        ``split`` bytes or rows (default: the source's)."""
        ranges = [r for r in ranges if r[2]]
        if self.format == "parquet":
            assert self.schema is not None
            rows = [(self.resolve(name), offset, length, -1) for name, offset, length in ranges]
            return parquet.read_frame(self.spark, self.schema, rows, split or self.split_rows)
        return self._parsed(self._read_text(ranges, split, finished))

    def read_partitions(self, ranges: Mapping[int, tuple[str, int, int]]) -> DataFrame:
        """One lazy frame of every partition's ``(file, offset, length)`` range, each row
        tagged with its partition (``emit_partitions``): the splits of all partitions
        spread over as many tasks as the session runs at once, not a task and a Python
        evaluation per partition."""
        from transactional.spark.connect import default_parallelism

        tasks = default_parallelism(self.spark)
        if self.format == "parquet":
            assert self.schema is not None
            tagged = [
                (self.resolve(name), o, n, p) for p, (name, o, n) in sorted(ranges.items()) if n
            ]
            return parquet.read_frame(self.spark, self.schema, tagged, self.split_rows, tasks)
        rows = [
            (partition, *row)
            for partition, named in sorted(ranges.items())
            for row in self._splits([named], self.split_bytes)
        ]
        frame = split_frame(
            self.spark,
            rows,
            f"partition INT, {_TEXT_SPLIT_SCHEMA}",
            lines.read_tagged_file_splits,
            tasks,
            lines.TAGGED_RECORD_SCHEMA,
        )
        return self._parsed(frame, (PARTITION_COLUMN,))

    def sample_batch(self) -> DataFrame | None:
        """The first ``SAMPLE_LINES`` records of the first file holding any, read as a
        batch is, in as many tasks as the session runs at once (so that every Python
        worker a batch uses is started): the runner's warm-up. None for an empty input."""
        for name in self.names():
            begin = self.data_start(name)
            length, count = self.scan(name, begin, SAMPLE_LINES)
            if length:
                self._sample = [FileRange(file=name, offset=begin, length=length, count=count)]
                return self.read_ranges([(name, begin, length)], self.per_task(length))
        return None

    # -- where a record sits -----------------------------------------------------------

    def batch_ranges(self, meta: Any) -> list[FileRange]:
        """The ranges of a txid, from what the spout's ``ack`` is given for it."""
        return []

    def locate(
        self, txid: int, meta: Any, records: Sequence[Mapping[str, Any]]
    ) -> list[str | None]:
        """Each record's file and line (``file part-1.jsonl line 7``; Parquet: ``row``,
        the file's first row being 1), found by reading the txid's ranges again on the
        driver: a record carries no position, so that a batch that balances pays for
        none, and the ledger asks only once a txid failed (``spout.locate``). A text
        record is found by its ``raw`` text, a Parquet row by its values; one on several
        lines (rows) of the ranges is named by them all, since it may be any of them
        (``file a.jsonl line 7 or 12 (same text)``)."""
        ranges = self._sample if meta is None else self.batch_ranges(meta)
        places: list[list[tuple[str, int]]] = [[] for _ in records]
        if self.format == "parquet":
            assert self.schema is not None
            schema = parquet.arrow_schema(self.schema)
            for r in ranges:
                rows = parquet.find_rows(self.resolve(r.file), r.offset, r.end, schema, records)
                for place, numbers in zip(places, rows, strict=True):
                    place.extend((r.file, n) for n in numbers)
        else:
            raws = [record.get("raw") for record in records]
            wanted = {raw for raw in raws if isinstance(raw, str)}
            for r in ranges:
                found = lines.find_lines(self.resolve(r.file), r.offset, r.length, wanted)
                for place, raw in zip(places, raws, strict=True):
                    if isinstance(raw, str):
                        place.extend((r.file, n) for n in found.get(raw, ()))
        unit, same = ("row", "values") if self.format == "parquet" else ("line", "text")
        return [_place(p, unit, same) if p else None for p in places]

    def _parsed(self, records: DataFrame, keep: Sequence[str] = ()) -> DataFrame:
        if self.schema is None:
            return records
        return parse.parsed(records, self.format, self.schema, self.options, keep)

    def _check_parquet(self, name: str) -> None:
        """Checked before the first range of a file is decided; a file whose size and
        time have not changed since is not asked again."""
        assert self.schema is not None
        self.size(name)  # the footer must be readable
        if name in self._checked and self._checked[name] == self._rows[name][:2]:
            return
        parquet.check_columns(
            self.who, self.resolve(name), self.schema, strict=self.schema_given is None
        )
        self._checked[name] = self._rows[name][:2]

    def _read_text(
        self,
        ranges: list[tuple[str, int, int]],
        split_bytes: int | None,
        finished: Collection[str],
    ) -> DataFrame:
        """Text records of the ranges. A range that is the whole of a file named in
        ``finished`` (one that no longer grows) is read by Spark's own text reader, in
        the JVM; the others by the range reader. Both give the same records for the same
        bytes (``lines``)."""
        whole = self._whole(ranges, finished)
        by_spark = {n: lines.read_text_files(self.spark, [self.resolve(n)]) for n in whole}
        # Spark listed each file as it made its frame: if one changed size since the check
        # above, its listing may not be the range; read them all by range instead.
        if by_spark and self._whole([r for r in ranges if r[0] in whole], finished) != whole:
            by_spark = {}
        split = split_bytes or self.split_bytes
        frames: list[DataFrame] = []
        for spark_reads, group in itertools.groupby(ranges, key=lambda r: r[0] in by_spark):
            if spark_reads:
                frames += [by_spark[name] for name, _, _ in group]
            else:
                rows = self._splits(group, split)
                frames.append(
                    split_frame(self.spark, rows, _TEXT_SPLIT_SCHEMA, lines.read_file_splits)
                )
        if not frames:
            return split_frame(self.spark, [], _TEXT_SPLIT_SCHEMA, lines.read_file_splits)
        return functools.reduce(lambda a, b: a.unionByName(b), frames)

    def _whole(self, ranges: Iterable[tuple[str, int, int]], finished: Collection[str]) -> set[str]:
        """The names of ``ranges`` that are a whole finished file Spark's reader can take
        (a CSV file with a header never is: its ranges start after the header)."""
        return {
            name
            for name, offset, length in ranges
            if name in finished
            and offset == 0
            and length == self.size(name)
            and lines.readable_by_spark(self.resolve(name))
        }

    def _splits(
        self, ranges: Iterable[tuple[str, int, int]], split_bytes: int
    ) -> list[tuple[str, int, int, int, int]]:
        return [
            row
            for name, offset, length in ranges
            if length
            for row in lines.file_splits(self.resolve(name), offset, length, split_bytes)
        ]
