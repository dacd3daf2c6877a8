"""Object storage as Spark reaches it: S3 through Hadoop's ``s3a`` connector, set up from
the standard AWS settings a user has for any S3 client, so that a table or a source in a
bucket needs nothing else: ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) for a store
other than AWS's, ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``), and the credentials, which
the connector's default chain reads (environment variables, a profile, an instance's
role). ``s3://`` is read as ``s3a://``, as delta-rs and pyarrow read both.

The connector's jars are resolved once from Maven Central (``transactional.spark.jars``):
Hadoop's ``hadoop-aws`` at the version of the Hadoop client PySpark ships, and the AWS
SDK modules it uses, not the SDK's 690 MB bundle.

Python code reaches the same places through pyarrow's file systems
(``arrow_file_system``, ``open_input``, ``file_info``), which read the same settings
from the environment: on a cluster, the executors need them too (instance roles, or
``spark.executorEnv.AWS_...``)."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple
from urllib.parse import urlsplit

from transactional.errors import ConfigurationError

if TYPE_CHECKING:
    import pyarrow.fs as pa_fs

__all__ = [
    "AWS_SDK_FOR_HADOOP",
    "FileInfo",
    "arrow_file_system",
    "file_info",
    "is_local",
    "is_s3",
    "open_input",
    "s3_packages",
    "s3_spark_conf",
]

#: The AWS SDK v2 version each Hadoop client a supported PySpark ships builds with
#: (``aws-java-sdk-v2.version`` in hadoop-project's POM): PySpark 4.2 ships 3.5.0.
AWS_SDK_FOR_HADOOP = {"3.5.0": "2.35.4"}
#: The SDK's modules the S3 connector needs, in place of its whole bundle.
_AWS_SDK_MODULES = ("s3", "sts", "apache-client", "s3-transfer-manager")
_BUNDLE = "software.amazon.awssdk:bundle"


def is_s3(location: str) -> bool:
    return urlsplit(location).scheme.lower() in ("s3", "s3a")


def is_local(location: str) -> bool:
    """A path (no scheme) or a ``file:`` URL."""
    return "://" not in location or location.lower().startswith("file:")


#: The AWS settings pyarrow's S3 file system reads: one file system per bucket and
#: settings (building one costs a round trip; the settings may change between tests).
_AWS_SETTINGS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_ALLOW_HTTP",
)


def arrow_file_system(location: str, what: str = "storage") -> tuple[pa_fs.FileSystem, str]:
    """pyarrow's file system for ``location`` (a local path, a ``file:`` URL, or an
    ``s3://`` or ``s3a://`` URL reached with the standard AWS settings) and the path
    inside it. ``what`` names the component in the error for any other URL."""
    import pyarrow.fs as pa_fs

    if "://" not in location:
        return pa_fs.LocalFileSystem(), os.path.abspath(location)
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return pa_fs.LocalFileSystem(), parts.path
    if scheme not in ("s3", "s3a") or not parts.netloc:
        raise ConfigurationError(
            f"{what}: {location} is not a place this project reads: give a local path or "
            "an S3 URL (s3://bucket/key)"
        )
    settings = tuple(os.environ.get(name) for name in _AWS_SETTINGS)
    return _s3(parts.netloc, settings), f"{parts.netloc}{parts.path}".rstrip("/")


@functools.lru_cache(maxsize=64)
def _s3(bucket: str, settings: tuple[str | None, ...]) -> pa_fs.FileSystem:
    import pyarrow.fs as pa_fs

    del settings  # part of the cache key only: pyarrow reads the environment itself
    return pa_fs.FileSystem.from_uri(f"s3://{bucket}")[0]


class FileInfo(NamedTuple):
    size: int
    mtime_ns: int


def file_info(location: str) -> FileInfo:
    """The size and modification time of the file at ``location``;
    ``FileNotFoundError`` if there is none (``OSError`` if it cannot be asked)."""
    if "://" not in location:
        stat = os.stat(location)
        return FileInfo(stat.st_size, stat.st_mtime_ns)
    import pyarrow.fs as pa_fs

    fs, path = arrow_file_system(location)
    info = fs.get_file_info(path)
    if info.type != pa_fs.FileType.File:
        raise FileNotFoundError(f"{location}: no such file")
    return FileInfo(int(info.size or 0), int(info.mtime_ns or 0))


def open_input(location: str) -> BinaryIO:
    """The file at ``location`` opened for reading at any position (``seek``, ``read``),
    as a context manager: a local file by Python, one in S3 by pyarrow (each ``read``
    a ranged GET)."""
    if "://" not in location:
        return open(location, "rb")
    fs, path = arrow_file_system(location)
    handle: Any = fs.open_input_file(path)
    return handle  # type: ignore[no-any-return]


def s3_spark_conf(
    env: Mapping[str, str] | None = None, ivy_dir: str | Path | None = None
) -> dict[str, str]:
    """Spark settings that read and write ``s3a://`` and ``s3://`` paths: the
    connector's jars (``spark.jars``; merge with other jars) and its settings from
    ``env`` (default: this process's environment). A plain-HTTP endpoint (an S3
    stand-in) is accepted only with ``AWS_ALLOW_HTTP=true``, as delta-rs requires. With
    PySpark's Connect client alone, no jars: a Connect server loads its own."""
    from transactional.spark.connect import client_only
    from transactional.spark.jars import session_jars

    env = os.environ if env is None else env
    conf = {"spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    if not client_only():
        jars = session_jars(s3_packages(), ivy_dir, excludes=[_BUNDLE])
        conf = {"spark.jars": ",".join(str(jar) for jar in jars), **conf}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        plain = endpoint.lower().startswith("http://")
        if plain and env.get("AWS_ALLOW_HTTP", "").lower() != "true":
            raise ConfigurationError(
                f"S3 endpoint {endpoint} is plain HTTP: set AWS_ALLOW_HTTP=true to use it "
                "(an S3 stand-in on a trusted network), or give an https:// endpoint"
            )
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        # A store other than AWS's names buckets in the path, not the host name.
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(not plain).lower()
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    return conf


def s3_packages() -> list[str]:
    """Hadoop's S3 connector at the version of the Hadoop client in PySpark's jars, and
    the AWS SDK modules that Hadoop builds with."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    found = sorted(p.name for p in jars.glob("hadoop-client-api-*.jar"))
    versions = [name.removeprefix("hadoop-client-api-").removesuffix(".jar") for name in found]
    sdk = AWS_SDK_FOR_HADOOP.get(versions[0]) if len(versions) == 1 else None
    if sdk is None:
        raise ConfigurationError(
            f"PySpark {pyspark.__version__}'s Hadoop client is {found or 'not in its jars'}, "
            f"for which no AWS SDK version is known (Hadoop {', '.join(AWS_SDK_FOR_HADOOP)}): "
            "install a PySpark in the project's range to read or write S3"
        )
    return [
        f"org.apache.hadoop:hadoop-aws:{versions[0]}",
        *(f"software.amazon.awssdk:{module}:{sdk}" for module in _AWS_SDK_MODULES),
    ]
