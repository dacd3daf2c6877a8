"""Files: a directory of JSON Lines, CSV or Parquet files (or one file), each txid a
range of lines or rows per file, decided on the driver and read in Spark tasks.

A directory holds one partition per regular file, in sorted name order; names starting
with ``.`` or ``_`` are skipped, as Spark and Hadoop do for their marker and temporary
files. Partition numbers are positions in that order, so new files must have names
that sort last (``part-00004`` after ``part-00003``); a range names its file, so a file
renamed, removed or inserted before others is refused instead of silently misread.

- ``FilesPartitionedSpout``: a partition per file, ``batch_size`` lines (rows) per
  partition per txid, replayed exactly.
- ``FilesOpaqueSpout``: the same ranges, for an opaque committer.
- ``FilesTransactionalSpout``: the files read as one sequence in name order,
  ``batch_size`` lines (rows) per txid; a file counts as finished once a later one
  exists, and a segment that is a whole finished text file is read by Spark's own text
  reader.

Formats (``format=``):

- ``"jsonl"`` (the default): a record per line, by the framing rule of
  ``transactional.sources.files._lines`` (one trailing ``\\r`` removed; bytes that are not
  UTF-8 flagged, never dropped). Without ``schema``: text records ``raw, error``, for
  a bolt to parse (any line-framed text will do). With ``schema``: the schema's
  columns, then ``raw, error``; a line that is not a JSON object of that schema (bad
  JSON, a value of another type, a number out of range) has null columns and an
  ``error`` saying so (``transactional.sources.files._parse``). Files grow by whole lines.
- ``"csv"``: a record per line (a quoted value cannot hold a newline), ``schema``
  required, the schema's columns then ``raw, error`` like JSON Lines with a schema; a
  line with more or fewer fields than the schema, or a value of another type, has an
  ``error``. ``header=True``: each file's first line names the columns, checked
  against the schema (another header stops the run with ``SourceSchemaError``).
- ``"parquet"``: rows ranges of immutable files (write a file under a hidden name and
  rename it when it is complete), only the row groups a range touches read, by
  ``pyarrow`` in Spark tasks. The schema is ``schema`` or the first file's; a file
  without one of its columns, or a value the schema's type would change, stops the run
  with ``SourceSchemaError`` or fails the txid (a safe cast), never a silent change.

Start positions (``start=``), for the files that exist when the topology starts (a
file that appears later is read from its beginning, so nothing written to it is
missed): ``"earliest"`` (the default), ``"latest"`` (only what is appended or added
after the start), ``{file name: offset}`` (a byte offset at a line start, or a row
number; other files from their beginning; the transactional kind takes one entry) or
a ``datetime`` (files last modified before it are skipped; the transactional kind
starts at the first file modified at or after it).

Where the files live: a local path (made absolute) or an S3 prefix or object
(``s3://bucket/dir`` or ``s3a://``), reached through pyarrow's file systems with the
standard AWS settings (``transactional.spark.storage``); any other URL is refused. The
coordinator side runs on the driver and only counts (newlines in big chunks, row counts
in Parquet footers); the emitters return lazy DataFrames whose reading runs in Spark
tasks, so the files must be reachable from every executor: a shared file system, or a
bucket with the AWS settings in the executors' environment too (an instance role, or
``spark.executorEnv.AWS_...``). In a bucket every range is read by the range reader
(Python in Spark tasks, ranged GETs), never by Spark's text reader, so no Spark
connector is needed.
"""

from transactional.sources.files._input import SAMPLE_LINES, FileRange
from transactional.sources.files._lines import records_batch
from transactional.sources.files._spouts import (
    FileSequenceMeta,
    FilesOpaqueSpout,
    FilesPartitionedSpout,
    FilesTransactionalSpout,
)

__all__ = [
    "SAMPLE_LINES",
    "FileRange",
    "FileSequenceMeta",
    "FilesOpaqueSpout",
    "FilesPartitionedSpout",
    "FilesTransactionalSpout",
    "records_batch",
]
