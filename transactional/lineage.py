"""Datasets as OpenLineage names them, for the run events ``RunnerConfig.lineage`` sends
(``docs/how-to/lineage.md``). A spout and a committer say what they read and write by
``lineage_datasets``; these helpers give the names OpenLineage's conventions use for
the places the ready-made ones know: a path (local or in S3), a Kafka topic, a Redis
key. Nothing here imports OpenLineage."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

__all__ = ["Dataset", "at_path", "in_kafka", "in_redis"]


class Dataset(NamedTuple):
    """An OpenLineage dataset's identity: the namespace of the place that holds it (a
    file system, a bucket, a broker, a server) and its name there."""

    namespace: str
    name: str


def at_path(location: str) -> Dataset:
    """A directory or file: ``s3://bucket`` and the key for an object store path
    (``s3a://`` read as ``s3://``), else ``file`` and the absolute local path."""
    scheme, _, rest = location.partition("://")
    if rest:
        bucket, _, key = rest.partition("/")
        scheme = "s3" if scheme in ("s3", "s3a") else scheme
        return Dataset(f"{scheme}://{bucket}", key.rstrip("/"))
    return Dataset("file", str(Path(location).resolve()))


def in_kafka(bootstrap_servers: str, topic: str) -> Dataset:
    """A topic: ``kafka://host:port`` of the first bootstrap server, and the topic."""
    first = bootstrap_servers.split(",")[0].strip()
    return Dataset(f"kafka://{first}", topic)


def in_redis(url: str, key: str) -> Dataset:
    """A key: ``redis://host:port/db`` (no credentials), and the key."""
    parts = urlsplit(url)
    database = parts.path.strip("/") or "0"
    return Dataset(f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}/{database}", key)
