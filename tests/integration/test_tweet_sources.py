"""The six tweet spouts, driven by hand the way a runner drives them: across several
txids the batches must be exactly the lines of the input, in order, none lost or
repeated; the same metadata must give the same records again; and a partition added
later must only be read by metadata decided after it appeared."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.tweets.generate import generate
from examples.tweets.load import load
from examples.tweets.sources import (
    FileOpaqueSpout,
    FilePartitionedSpout,
    FileTransactionalSpout,
    RedisOpaqueSpout,
    RedisPartitionedSpout,
    RedisTransactionalSpout,
)
from transactional.errors import ContractError
from transactional.spout import SpoutContext
from transactional.types import TransactionAttempt, dump_meta, load_meta

# Executors must run this interpreter (it has pyarrow); set before the session starts.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

pytestmark = pytest.mark.integration

Record = tuple[str, str | None]


def _expected(path: Path) -> list[Record]:
    """The framing rule written again: split on b"\\n", a last line without newline
    counts, one trailing \\r stripped, invalid UTF-8 escaped and flagged."""
    parts = path.read_bytes().split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    out: list[Record] = []
    for line in parts:
        line = line[:-1] if line.endswith(b"\r") else line
        try:
            out.append((line.decode("utf-8"), None))
        except UnicodeDecodeError:
            out.append((line.decode("utf-8", "backslashreplace"), "invalid UTF-8"))
    return out


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """300 generated lines in 3 files, plus the awkward cases written as raw bytes."""
    root = tmp_path / "tweets"
    generate(root, 300, seed=11, partitions=3, bad_rate=0.1)
    with open(root / "part-00000.jsonl", "ab") as f:
        f.write(b'{"id": 1, "text": "caf\xe9 #latin1"}\n')  # invalid UTF-8
        f.write(b'{"id": 2, "text": "crlf #line"}\r\n')
        f.write(b"\n")  # a blank line is a record too
    with open(root / "part-00002.jsonl", "ab") as f:
        f.write(b'{"id": 3, "text": "no newline at EOF \xff"}')
    (root / "_SUCCESS").write_bytes(b"")  # marker files are not partitions
    return root


def _rows(df: Any) -> list[Record]:
    return [(r.raw, r.error) for r in df.collect()]


def _open(spout: Any, spark: Any) -> Any:
    spout.open(SpoutContext(spark, "test"))
    return spout


def _roundtrip(meta: Any) -> Any:
    """As the runner does: metadata goes through the store as JSON."""
    return load_meta(type(meta), dump_meta(meta))


def _attempts() -> Iterator[TransactionAttempt]:
    txid = 0
    while True:
        txid += 1
        yield TransactionAttempt(txid, 1)


def _drive_transactional(spout: Any, prev: Any, limit: int = 20) -> tuple[list[Record], list[Any]]:
    records: list[Record] = []
    metas: list[Any] = []
    for attempt in _attempts():
        assert attempt.txid < limit, "the spout never drained"
        if not spout.is_ready(attempt.txid, prev):
            return records, metas
        meta = _roundtrip(spout.initialize_transaction(attempt.txid, prev))
        batch = _rows(spout.emit_batch(attempt, meta))
        assert len(batch) == meta.count
        records += batch
        metas.append(meta)
        prev = meta
    raise AssertionError("unreachable")


def _drive_partitioned(
    spout: Any, last: dict[int, Any], opaque: bool, limit: int = 20
) -> tuple[dict[int, list[Record]], list[dict[int, Any]]]:
    """Each txid: decide every partition's range, then read all partitions as one union
    (one Spark job), sliced back by the metadata's counts."""
    records: dict[int, list[Record]] = {}
    history: list[dict[int, Any]] = []
    for attempt in _attempts():
        assert attempt.txid < limit, "the spout never drained"
        if not spout.is_ready(attempt.txid, last):
            return records, history
        metas, frames = {}, []
        for p in range(spout.num_partitions()):
            if opaque:
                meta, frame = spout.emit_partition_batch(attempt, p, last.get(p))
            else:
                meta = spout.emit_partition_batch_new(attempt, p, last.get(p))
                frame = spout.emit_partition_batch(attempt, p, _roundtrip(meta))
            metas[p] = _roundtrip(meta)
            frames.append(frame)
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame)
        rows = _rows(union)
        assert len(rows) == sum(m.count for m in metas.values())
        for p, meta in metas.items():
            records.setdefault(p, []).extend(rows[: meta.count])
            rows = rows[meta.count :]
        history.append(metas)
        last = {**last, **metas}
    raise AssertionError("unreachable")


def test_file_transactional_reads_the_directory_as_one_sequence(spark: Any, dataset: Path) -> None:
    spout = _open(FileTransactionalSpout(dataset, batch_size=70), spark)
    files = sorted(dataset.glob("part-*.jsonl"))
    expected = [r for f in files for r in _expected(f)]

    records, metas = _drive_transactional(spout, None)
    assert records == expected
    assert any(len(m.segments) > 1 for m in metas)  # some batch spans two files
    again = TransactionAttempt(len(metas), 2)
    assert _rows(spout.emit_batch(again, metas[1])) == records[70:140]

    added = dataset / "part-00003.jsonl"
    added.write_bytes(b'{"id": 4, "text": "late #file"}\n{"id": 5, "text": "x"}\n')
    assert _rows(spout.emit_batch(again, metas[-1])) == records[70 * (len(metas) - 1) :]
    more, new_metas = _drive_transactional(spout, metas[-1])
    assert more == _expected(added)
    assert [s.file for s in new_metas[0].segments] == ["part-00003.jsonl"]


def test_file_transactional_single_file_and_empty_batches(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_bytes(b"a\nb\r\nc")
    spout = _open(FileTransactionalSpout(path, batch_size=2), spark)
    records, metas = _drive_transactional(spout, None)
    assert records == [("a", None), ("b", None), ("c", None)]
    assert spout.is_ready(9, metas[-1]) is False
    with open(path, "ab") as f:
        f.write(b"\nd\n")  # the unterminated "c" was taken: the writer broke the rule
    assert _drive_transactional(spout, metas[-1])[0] == [("", None), ("d", None)]


@pytest.mark.parametrize("kind", [FilePartitionedSpout, FileOpaqueSpout])
def test_file_partitioned_kinds(spark: Any, dataset: Path, kind: type) -> None:
    spout = _open(kind(dataset, batch_size=40), spark)
    opaque = kind is FileOpaqueSpout
    assert spout.num_partitions() == 3

    records, history = _drive_partitioned(spout, {}, opaque)
    files = sorted(dataset.glob("part-*.jsonl"))
    assert records == {p: _expected(f) for p, f in enumerate(files)}
    assert all(m.file == files[p].name for metas in history for p, m in metas.items())

    if not opaque:  # the same metadata gives the same records
        meta = history[1][2]
        again = _rows(spout.emit_partition_batch(TransactionAttempt(2, 7), 2, meta))
        assert again == records[2][40:80]

    added = dataset / "part-00003.jsonl"
    added.write_bytes(b'{"id": 4, "text": "late #partition"}\n')
    assert spout.num_partitions() == 4
    last = {p: m for metas in history for p, m in metas.items()}
    if not opaque:  # old metadata knows nothing of partition 3
        old = history[0]
        frames = [
            spout.emit_partition_batch(TransactionAttempt(1, 9), p, m) for p, m in old.items()
        ]
        assert sum(len(_rows(f)) for f in frames) == sum(m.count for m in old.values())
    more, _ = _drive_partitioned(spout, last, opaque)
    assert more == {0: [], 1: [], 2: [], 3: _expected(added)}


def test_file_spouts_refuse_a_partition_file_inserted_before_others(
    spark: Any, dataset: Path
) -> None:
    spout = _open(FilePartitionedSpout(dataset, batch_size=1000), spark)
    attempt = TransactionAttempt(1, 1)
    last = {p: spout.emit_partition_batch_new(attempt, p, None) for p in range(3)}
    (dataset / "part-00000a.jsonl").write_bytes(b"x\n")
    with pytest.raises(Exception, match="sort after the existing ones"):
        spout.emit_partition_batch_new(TransactionAttempt(2, 1), 1, last[1])


@pytest.fixture
def loaded(dataset: Path, redis_url: str) -> Path:
    assert load(dataset, redis_url, prefix="q") == {
        p: len(_expected(f)) for p, f in enumerate(sorted(dataset.glob("part-*.jsonl")))
    }
    return dataset


def test_redis_transactional_spreads_batches_over_the_queues(
    spark: Any, loaded: Path, redis_url: str
) -> None:
    spout = _open(RedisTransactionalSpout(redis_url, prefix="q", batch_size=90), spark)
    records, metas = _drive_transactional(spout, None)
    by_queue: dict[int, list[Record]] = {}
    position = 0
    for meta in metas:
        assert meta.count == min(
            90, sum(len(_expected(f)) for f in loaded.glob("part-*")) - position
        )
        position += meta.count
    offset = 0
    for meta in metas:
        for r in meta.ranges:
            by_queue.setdefault(r.partition, []).extend(records[offset : offset + r.count])
            offset += r.count
    files = sorted(loaded.glob("part-*.jsonl"))
    assert by_queue == {p: _expected(f) for p, f in enumerate(files)}
    assert _rows(spout.emit_batch(TransactionAttempt(2, 5), metas[1])) == records[90:180]

    import redis

    client = redis.Redis.from_url(redis_url)
    client.delete("q:0:3")
    with pytest.raises(Exception, match="q:0:3 is missing"):
        _rows(spout.emit_batch(TransactionAttempt(1, 5), metas[0]))
    client.close()
    spout.close()


@pytest.mark.parametrize("kind", [RedisPartitionedSpout, RedisOpaqueSpout])
def test_redis_partitioned_kinds(spark: Any, loaded: Path, redis_url: str, kind: type) -> None:
    spout = _open(kind(redis_url, prefix="q", batch_size=40), spark)
    opaque = kind is RedisOpaqueSpout
    records, history = _drive_partitioned(spout, {}, opaque)
    files = sorted(loaded.glob("part-*.jsonl"))
    assert records == {p: _expected(f) for p, f in enumerate(files)}
    if not opaque:
        meta = history[1][0]
        assert (
            _rows(spout.emit_partition_batch(TransactionAttempt(2, 3), 0, meta))
            == records[0][40:80]
        )

    extra = loaded.parent / "extra"
    extra.mkdir()
    for name in ("a", "b", "c", "d"):
        (extra / name).write_bytes(b"" if name != "d" else b"late\n")
    load(extra, redis_url, prefix="q", append=True)  # appends "late" to a new queue 3
    last = {p: m for metas in history for p, m in metas.items()}
    more, _ = _drive_partitioned(spout, last, opaque)
    assert more == {0: [], 1: [], 2: [], 3: [("late", None)]}
    spout.close()


def _sample(spout: Any) -> tuple[list[Record], int]:
    """The sample's records, and the Spark tasks that read it."""
    frame = spout.sample_batch()
    return _rows(frame), frame.rdd.getNumPartitions()


@pytest.mark.parametrize("kind", [FileTransactionalSpout, FilePartitionedSpout, FileOpaqueSpout])
def test_file_spouts_sample_the_first_lines_in_parallel_tasks(
    spark: Any, tmp_path: Path, kind: type
) -> None:
    from examples.tweets.inputs import SAMPLE_LINES

    root = tmp_path / "in"
    root.mkdir()
    (root / "part-00000.jsonl").write_bytes(b"")  # an empty first file is passed over
    generate(root / "more", SAMPLE_LINES + 40, seed=3, partitions=1, bad_rate=0.1)
    (root / "more" / "part-00000.jsonl").rename(root / "part-00001.jsonl")
    (root / "more").rmdir()
    spout = _open(kind(root, batch_size=7), spark)
    records, tasks = _sample(spout)
    assert records == _expected(root / "part-00001.jsonl")[:SAMPLE_LINES]
    assert tasks == spark.sparkContext.defaultParallelism
    for name in os.listdir(root):
        (root / name).write_bytes(b"")
    assert spout.sample_batch() is None  # nothing to sample: no warm-up


@pytest.mark.parametrize("kind", [RedisTransactionalSpout, RedisPartitionedSpout, RedisOpaqueSpout])
def test_redis_spouts_sample_the_first_queue_holding_messages(
    spark: Any, loaded: Path, redis_url: str, kind: type
) -> None:
    spout = _open(kind(redis_url, prefix="q", batch_size=5), spark)
    files = sorted(loaded.glob("part-*.jsonl"))
    records, tasks = _sample(spout)
    from examples.tweets.inputs import SAMPLE_LINES

    assert records == _expected(files[0])[:SAMPLE_LINES]
    assert tasks == min(len(records), spark.sparkContext.defaultParallelism)
    assert _open(kind(redis_url, prefix="nothing", batch_size=5), spark).sample_batch() is None
    spout.close()


def test_file_partitioned_emits_all_partitions_as_one_tagged_frame(
    spark: Any, dataset: Path
) -> None:
    """The one frame holds each partition's records of the same metadata, tagged with
    the partition, in fewer tasks; the engine reads the same batch and the same digests
    from it as from the per-partition frames."""
    from transactional.engine import SparkEngine
    from transactional.spout import PARTITION_COLUMN

    spout = _open(FilePartitionedSpout(dataset, batch_size=40), spark)
    attempt = TransactionAttempt(1, 1)
    metas = {p: spout.emit_partition_batch_new(attempt, p, None) for p in range(3)}
    metas[1] = spout.emit_partition_batch_new(attempt, 1, metas[1])  # not at offset 0
    combined = spout.emit_partitions(attempt, metas)
    rows = combined.collect()
    files = sorted(dataset.glob("part-*.jsonl"))
    for p, meta in metas.items():
        mine = [(r.raw, r.error) for r in rows if r[PARTITION_COLUMN] == p]
        assert mine == _rows(spout.emit_partition_batch(attempt, p, meta))
        assert mine == _expected(files[p])[meta.offset and 40 : (meta.offset and 40) + 40]
    assert combined.rdd.getNumPartitions() <= spark.sparkContext.defaultParallelism

    engine = SparkEngine(spark)
    one = engine.materialise([combined], True, partitions=3)
    per = engine.materialise(
        [spout.emit_partition_batch(attempt, p, metas[p]) for p in range(3)], True
    )
    assert one.digests == per.digests and one.records == per.records == 120
    assert sorted(_rows(one.batch)) == sorted(_rows(per.batch))
    assert engine.materialise([combined], False, partitions=3).records == 120
    stray = combined.withColumn(PARTITION_COLUMN, combined[PARTITION_COLUMN] + 3)
    with pytest.raises(ContractError, match="tagged with partition 3"):
        engine.materialise([stray], True, partitions=3)
