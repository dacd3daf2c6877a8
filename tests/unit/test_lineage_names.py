"""Dataset names as OpenLineage's naming conventions give them (openlineage.io, "Naming
Conventions": a local path is namespace ``file`` and its absolute path, an object
store path ``s3://bucket`` and its key, a Kafka topic ``kafka://host:port`` of a
bootstrap server and the topic); a Redis key, which the conventions leave out, is
``redis://host:port/db`` and the key, credentials never in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from transactional.lineage import Dataset, at_path, in_kafka, in_redis


def test_a_local_path_is_file_and_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert at_path("tables/totals") == Dataset("file", f"{tmp_path}/tables/totals")
    assert at_path(f"{tmp_path}/x/") == Dataset("file", f"{tmp_path}/x")


@pytest.mark.parametrize(
    ("location", "dataset"),
    [
        ("s3://lake/orders/", Dataset("s3://lake", "orders")),
        ("s3a://lake/tables/totals", Dataset("s3://lake", "tables/totals")),
    ],
)
def test_an_s3_path_is_its_bucket_and_key(location: str, dataset: Dataset) -> None:
    assert at_path(location) == dataset


def test_a_topic_is_named_by_its_first_bootstrap_server() -> None:
    assert in_kafka("b1:9092, b2:9092", "tweets") == Dataset("kafka://b1:9092", "tweets")


@pytest.mark.parametrize(
    ("url", "namespace"),
    [
        ("redis://:secret@cache:6380/2", "redis://cache:6380/2"),
        ("rediss://user:pw@cache/", "rediss://cache:6379/0"),
        ("redis://127.0.0.1:7000", "redis://127.0.0.1:7000/0"),
    ],
)
def test_a_redis_key_is_its_server_and_database_without_credentials(
    url: str, namespace: str
) -> None:
    assert in_redis(url, "totals") == Dataset(namespace, "totals")
