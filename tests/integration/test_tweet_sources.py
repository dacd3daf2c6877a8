"""The demo's three Redis spouts, driven by hand the way a runner drives them: across
several txids the batches must be exactly the lines loaded, in order, none lost or
repeated; the same metadata must give the same records again; and a queue added later
must only be read by metadata decided after it appeared. (The file spouts are the
library's: ``test_file_source``.)"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from examples.tweets.load import load
from examples.tweets.sources import (
    RedisOpaqueSpout,
    RedisPartitionedSpout,
    RedisTransactionalSpout,
)
from tests.spouts import (
    awkward_dataset,
    drive_partitioned,
    drive_transactional,
    opened,
    records_of,
    rows,
    sample,
)
from transactional.sources.files import SAMPLE_LINES
from transactional.types import TransactionAttempt

# Executors must run this interpreter (it has pyarrow); set before the session starts.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

pytestmark = [pytest.mark.integration, pytest.mark.connect]


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return awkward_dataset(tmp_path / "tweets")


@pytest.fixture
def loaded(dataset: Path, redis_url: str) -> Path:
    assert load(dataset, redis_url, prefix="q") == {
        p: len(records_of(f)) for p, f in enumerate(sorted(dataset.glob("part-*.jsonl")))
    }
    return dataset


def test_redis_transactional_spreads_batches_over_the_queues(
    spark: Any, loaded: Path, redis_url: str
) -> None:
    spout = opened(RedisTransactionalSpout(redis_url, prefix="q", batch_size=90), spark)
    records, metas = drive_transactional(spout, None)
    by_queue: dict[int, list[Any]] = {}
    position = 0
    for meta in metas:
        assert meta.count == min(
            90, sum(len(records_of(f)) for f in loaded.glob("part-*")) - position
        )
        position += meta.count
    offset = 0
    for meta in metas:
        for r in meta.ranges:
            by_queue.setdefault(r.partition, []).extend(records[offset : offset + r.count])
            offset += r.count
    files = sorted(loaded.glob("part-*.jsonl"))
    assert by_queue == {p: records_of(f) for p, f in enumerate(files)}
    assert rows(spout.emit_batch(TransactionAttempt(2, 5), metas[1])) == records[90:180]

    import redis

    client = redis.Redis.from_url(redis_url)
    client.delete("q:0:3")
    with pytest.raises(Exception, match="q:0:3 is missing"):
        rows(spout.emit_batch(TransactionAttempt(1, 5), metas[0]))
    client.close()
    spout.close()


@pytest.mark.parametrize("kind", [RedisPartitionedSpout, RedisOpaqueSpout])
def test_redis_partitioned_kinds(spark: Any, loaded: Path, redis_url: str, kind: type) -> None:
    spout = opened(kind(redis_url, prefix="q", batch_size=40), spark)
    opaque = kind is RedisOpaqueSpout
    records, history = drive_partitioned(spout, {}, opaque)
    files = sorted(loaded.glob("part-*.jsonl"))
    assert records == {p: records_of(f) for p, f in enumerate(files)}
    if not opaque:
        meta = history[1][0]
        assert (
            rows(spout.emit_partition_batch(TransactionAttempt(2, 3), 0, meta)) == records[0][40:80]
        )

    extra = loaded.parent / "extra"
    extra.mkdir()
    for name in ("a", "b", "c", "d"):
        (extra / name).write_bytes(b"" if name != "d" else b"late\n")
    load(extra, redis_url, prefix="q", append=True)  # appends "late" to a new queue 3
    last = {p: m for metas in history for p, m in metas.items()}
    more, _ = drive_partitioned(spout, last, opaque)
    assert more == {0: [], 1: [], 2: [], 3: [("late", None)]}
    spout.close()


@pytest.mark.classic
@pytest.mark.parametrize("kind", [RedisTransactionalSpout, RedisPartitionedSpout, RedisOpaqueSpout])
def test_redis_spouts_sample_the_first_queue_holding_messages(
    spark: Any, loaded: Path, redis_url: str, kind: type
) -> None:
    spout = opened(kind(redis_url, prefix="q", batch_size=5), spark)
    files = sorted(loaded.glob("part-*.jsonl"))
    records, tasks = sample(spout)
    assert records == records_of(files[0])[:SAMPLE_LINES]
    assert tasks == min(len(records), spark.sparkContext.defaultParallelism)
    assert opened(kind(redis_url, prefix="nothing", batch_size=5), spark).sample_batch() is None
    spout.close()
