"""The committer contract (``transactional.testing.committer_contract``) on the real
sinks: Redis (fenced by token, inside its commit script) and Delta (which cannot compare
a token with its write, so its leadership check must stop a deposed leader), in both
modes, each read back from the sink itself."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from committers import CounterTable, DeltaCommitter, RedisCommitter
from transactional.testing.committer_contract import CommitterContract, SinkUnderTest
from transactional.types import CommitMode, CommitOutcome, Guarantee

pytestmark = pytest.mark.integration

TABLE = CounterTable("contract_counts", ("key",))


def frame(spark: Any, counts: Mapping[str, int]) -> Mapping[str, Any]:
    rows = [(key, n) for key, n in counts.items()]
    return {"default": spark.createDataFrame(rows, "key string, count bigint")}


class RedisSink(SinkUnderTest):
    fences_by_token = True

    def __init__(self, url: str, spark: Any) -> None:
        self.url, self.session = url, spark

    def committer(self, mode: CommitMode) -> RedisCommitter:
        return RedisCommitter(self.url, {"default": TABLE}, mode=mode)

    def inputs(self, counts: Mapping[str, int]) -> Mapping[str, Any]:
        return frame(self.session, counts)

    def read(self) -> dict[str, int]:
        held = self.committer(CommitMode.TRANSACTIONAL).read(TABLE.name)
        return {str(key): int(n) for (key,), n in held.items()}

    def spark(self) -> Any:
        return self.session


class DeltaSink(SinkUnderTest):
    fences_by_token = False  # a Delta write cannot compare a token: it checks leadership

    def __init__(self, path: Path | str, spark: Any) -> None:
        self.path, self.session = str(path), spark

    def committer(self, mode: CommitMode) -> DeltaCommitter:
        return DeltaCommitter(self.path, {"default": TABLE}, mode=mode)

    def inputs(self, counts: Mapping[str, int]) -> Mapping[str, Any]:
        return frame(self.session, counts)

    def read(self) -> dict[str, int]:
        location = f"{self.path}/{TABLE.name}"
        rows = self.session.read.format("delta").load(location).collect()
        return {row["key"]: row["count"] for row in rows}

    def spark(self) -> Any:
        return self.session


class AppliesAgain(CommitterContract):
    """The built-in committers take the cheaper way the contract allows under the
    weaker guarantees: a held txid is applied again, never skipped."""

    def test_unchecked_a_held_txid_is_applied_again(
        self, sink: SinkUnderTest, transactional: CommitMode
    ) -> None:
        with self.opened(sink, transactional) as exact:
            assert self.commit(sink, exact, 1, {"a": 1, "b": 2}) is CommitOutcome.APPLIED
        with self.opened(sink, transactional, guarantee=Guarantee.AT_LEAST_ONCE) as again:
            assert self.commit(sink, again, 1, {"a": 1, "b": 2}) is CommitOutcome.APPLIED
            assert again.committed_txid() == 1
        assert sink.read() == {"a": 2, "b": 4}


@pytest.mark.connect
class TestRedisCommitter(AppliesAgain):
    groups = True

    @pytest.fixture
    def sink(self, redis_url: str, spark: Any) -> RedisSink:
        return RedisSink(redis_url, spark)


@pytest.mark.connect
class TestDeltaCommitter(AppliesAgain):
    groups = True

    @pytest.fixture
    def sink(self, tmp_path: Path, spark: Any) -> DeltaSink:
        return DeltaSink(tmp_path / "delta", spark)


class TestDeltaCommitterOnS3(AppliesAgain):
    """The same contract with the tables in a bucket of the S3 stand-in (moto), written
    by delta-rs through S3's conditional writes and read back by delta-spark (s3a)."""

    groups = True

    @pytest.fixture
    def sink(self, s3_bucket: str, spark: Any) -> DeltaSink:
        return DeltaSink(f"s3://{s3_bucket}/delta", spark)
