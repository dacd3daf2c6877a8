"""Where a Delta committer's tables may live (``committers.delta.table_root``): a local
path made absolute, a ``file:`` or S3 URL kept as given, any other URL refused with a
message naming the setting, never taken for a local directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from committers import CounterTable, DeltaCommitter
from committers.delta import table_root
from transactional.errors import ConfigurationError


def test_a_local_path_is_made_absolute_and_a_url_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert table_root("lake/t1") == str(tmp_path / "lake" / "t1")
    assert table_root("s3://lake/t1/") == "s3://lake/t1"
    assert table_root("s3a://lake/t1") == "s3a://lake/t1"
    assert table_root("file:///data/t1/") == "file:///data/t1"


@pytest.mark.parametrize(
    "url", ["gs://lake/t1", "abfss://c@a.dfs.core.windows.net/t", "hdfs://nn/t"]
)
def test_a_store_the_committer_does_not_write_is_refused_by_name(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    scheme = url.split("://")[0]
    with pytest.raises(ConfigurationError, match=rf"--delta-path: {url} .*\({scheme}://\)"):
        table_root(url, "--delta-path")
    with pytest.raises(ConfigurationError, match=rf"^DeltaCommitter: {url} is on a store"):
        DeltaCommitter(url, {"in": CounterTable("t", ("k",))})
    assert list(tmp_path.iterdir()) == []  # nothing made locally


def test_an_s3_url_without_a_bucket_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="names no bucket"):
        table_root("s3:///t1")


def test_the_executors_writer_is_refused_for_tables_in_s3() -> None:
    with pytest.raises(ConfigurationError, match=r"max_driver_rows=0 .* S3 \(s3://lake/t\)"):
        DeltaCommitter("s3://lake/t", {"in": CounterTable("t", ("k",))}, max_driver_rows=0)
