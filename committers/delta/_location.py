"""Where a Delta committer's tables may live, and how each kind of place is reached: a
local directory (a path, or a ``file:`` URL) or an S3 bucket (``s3://`` or ``s3a://``,
reached through the standard AWS settings: ``AWS_ENDPOINT_URL``, ``AWS_REGION``,
credentials, and ``AWS_ALLOW_HTTP`` for a plain-HTTP endpoint). Any other URL is
refused, never taken for a local path (``s3:/lake`` as a directory of the working
directory, say)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from transactional.errors import ConfigurationError

__all__ = ["OBJECT_STORES", "is_object_store", "local_dir", "sql_name", "table_root"]

#: The URL schemes of the object stores the committer writes (S3, by delta-rs on the
#: driver; Spark reads them as ``s3a``).
OBJECT_STORES = ("s3", "s3a")


def table_root(path: str, what: str = "DeltaCommitter") -> str:
    """Where tables under ``path`` live: a bucket's URL as given (without a trailing
    ``/``), a local path made absolute (Delta reads a relative location as a table
    name). ``what`` names the setting in the error of a URL this committer cannot
    write, or of an S3 URL without a bucket."""
    if "://" not in path:
        return os.path.abspath(path)
    parts = urlsplit(path)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return path.rstrip("/")
    if scheme not in OBJECT_STORES:
        raise ConfigurationError(
            f"{what}: {path} is on a store the Delta committer does not write "
            f"({scheme}://); use a local directory or an S3 bucket (s3://bucket/dir)"
        )
    if not parts.netloc:
        raise ConfigurationError(f"{what}: {path} names no bucket; use s3://bucket/dir")
    return path.rstrip("/")


def local_dir(location: str) -> Path | None:
    """The directory of a local table location (a path or a ``file:`` URL), else None."""
    if location.startswith("file:"):
        return Path(urlsplit(location).path)
    return None if "://" in location else Path(location)


def is_object_store(location: str) -> bool:
    return local_dir(location) is None


def sql_name(location: str) -> str:
    """The Delta table at ``location`` as Spark SQL names it (``delta.`<location>```)."""
    return "delta.`" + location.replace("`", "``") + "`"
