"""Backfill and late starts through the runner (``RunnerConfig.start_from``, the CLI's
``--start-from``) on the file source, a real Redis sink and the SQLite store: the
counts are exactly the lines after the chosen position, computed here from the files;
a start given to a topology that already started, or to a spout that cannot take one,
is refused before anything is stored."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from committers import CounterTable, RedisCommitter
from coordinators import SQLiteStateStore
from tests.integration.topologies import RangeSpout, build
from transactional import Bolt, RunnerConfig, TopologyBuilder, TransactionalRunner
from transactional.errors import ConfigurationError
from transactional.sources.files import FilesPartitionedSpout
from transactional.types import TransactionAttempt

pytestmark = [pytest.mark.integration, pytest.mark.connect]


class CountWords(Bolt):
    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        return batch.groupBy(F.col("raw").alias("word")).count()


def _topology(root: Path, redis_url: str) -> Any:
    sink = RedisCommitter(redis_url, {"default": CounterTable("words", ("word",))})
    return (
        TopologyBuilder()
        .set_spout(FilesPartitionedSpout(root, batch_size=2))
        .set_bolt("count", CountWords())
        .set_committer("sink", sink, "count")
        .build()
    )


def _run(spark: Any, root: Path, redis_url: str, state: Path, **settings: Any) -> Any:
    config = RunnerConfig(topology_id="words", warm_up=False, **settings)
    store = SQLiteStateStore(state / "state.db")
    return TransactionalRunner(_topology(root, redis_url), store, spark, config).run(
        until_drained=True
    )


def _held(redis_url: str) -> Counter[str]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        return Counter({k: int(v) for k, v in client.hgetall("words").items()})
    finally:
        client.close()


def test_a_new_topology_starts_where_it_is_told(spark: Any, redis_url: str, tmp_path: Path) -> None:
    root = tmp_path / "in"
    root.mkdir()
    (root / "a").write_text("x\ny\nz\nx\n")
    (root / "b").write_text("y\ny\n")

    # From the third line of "a" (byte 4), all of "b".
    first = _run(spark, root, redis_url, tmp_path / "s", start_from=f"a={len(b'x' + b'y') + 2}")
    assert _held(redis_url) == Counter(["z", "x", "y", "y"]) and first.failures == 0

    # The start is stored with the first txid: the next run goes on from there.
    with open(root / "a", "a") as f:
        f.write("late\n")
    (root / "c").write_text("new\n")  # a file of after the start: read whole
    _run(spark, root, redis_url, tmp_path / "s")
    assert _held(redis_url) == Counter(["z", "x", "y", "y", "late", "new"])

    # The same topology id again with a start: refused, nothing changes.
    with pytest.raises(ConfigurationError, match=r"has already started .* a start position"):
        _run(spark, root, redis_url, tmp_path / "s", start_from="earliest")
    assert _held(redis_url) == Counter(["z", "x", "y", "y", "late", "new"])


def test_a_spout_that_cannot_take_a_start_is_refused(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    config = RunnerConfig(topology_id="buckets", start_from="earliest")
    store = SQLiteStateStore(tmp_path / "state.db")
    runner = TransactionalRunner(build(spark, redis_url, RangeSpout()), store, spark, config)
    with pytest.raises(ConfigurationError, match="does not read a start position"):
        runner.run(until_drained=True)
    assert redis.Redis.from_url(redis_url).hgetall("buckets") == {}
