"""Driving a spout by hand, the way a runner drives it: the helpers the source tests
share. Metadata goes through the store's JSON on the way, as it does in a run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.reference import records_of
from transactional.spout import SpoutContext
from transactional.types import TransactionAttempt, dump_meta, load_meta

Record = tuple[str, str | None]

__all__ = [
    "Record",
    "awkward_dataset",
    "drive_partitioned",
    "drive_transactional",
    "opened",
    "records_of",
    "roundtrip",
    "rows",
    "sample",
]


def awkward_dataset(root: Path) -> Path:
    """300 generated tweet lines in 3 files under ``root``, plus the awkward cases
    written as raw bytes: invalid UTF-8, a CRLF line, a blank line, a last line without
    newline, and a marker file that is no partition."""
    from examples.tweets.generate import generate

    generate(root, 300, seed=11, partitions=3, bad_rate=0.1)
    with open(root / "part-00000.jsonl", "ab") as f:
        f.write(b'{"id": 1, "text": "caf\xe9 #latin1"}\n')  # invalid UTF-8
        f.write(b'{"id": 2, "text": "crlf #line"}\r\n')
        f.write(b"\n")  # a blank line is a record too
    with open(root / "part-00002.jsonl", "ab") as f:
        f.write(b'{"id": 3, "text": "no newline at EOF \xff"}')
    (root / "_SUCCESS").write_bytes(b"")  # marker files are not partitions
    return root


def rows(df: Any, columns: tuple[str, ...] = ("raw", "error")) -> list[Any]:
    """The frame's rows as tuples of ``columns`` (text records by default)."""
    return [tuple(r[c] for c in columns) for r in df.collect()]


def opened(spout: Any, spark: Any) -> Any:
    spout.open(SpoutContext(spark, "test"))
    return spout


def roundtrip(meta: Any) -> Any:
    """As the runner does: metadata goes through the store as JSON."""
    return load_meta(type(meta), dump_meta(meta))


def attempts() -> Iterator[TransactionAttempt]:
    txid = 0
    while True:
        txid += 1
        yield TransactionAttempt(txid, 1)


def drive_transactional(
    spout: Any, prev: Any, limit: int = 20, read: Callable[[Any], list[Any]] = rows
) -> tuple[list[Any], list[Any]]:
    records: list[Any] = []
    metas: list[Any] = []
    for attempt in attempts():
        assert attempt.txid < limit, "the spout never drained"
        if not spout.is_ready(attempt.txid, prev):
            return records, metas
        meta = roundtrip(spout.initialize_transaction(attempt.txid, prev))
        batch = read(spout.emit_batch(attempt, meta))
        assert len(batch) == getattr(meta, "count", len(batch))
        records += batch
        metas.append(meta)
        prev = meta
    raise AssertionError("unreachable")


def drive_partitioned(
    spout: Any,
    last: dict[int, Any],
    opaque: bool,
    limit: int = 20,
    read: Callable[[Any], list[Any]] = rows,
) -> tuple[dict[int, list[Any]], list[dict[int, Any]]]:
    """Each txid: decide every partition's range, then read all partitions as one union
    (one Spark job), sliced back by the metadata's counts."""
    records: dict[int, list[Any]] = {}
    history: list[dict[int, Any]] = []
    for attempt in attempts():
        assert attempt.txid < limit, "the spout never drained"
        if not spout.is_ready(attempt.txid, last):
            return records, history
        metas, frames = {}, []
        for p in range(spout.num_partitions()):
            if opaque:
                meta, frame = spout.emit_partition_batch(attempt, p, last.get(p))
            else:
                meta = spout.emit_partition_batch_new(attempt, p, last.get(p))
                frame = spout.emit_partition_batch(attempt, p, roundtrip(meta))
            metas[p] = roundtrip(meta)
            frames.append(frame)
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame)
        got = read(union)
        assert len(got) == sum(m.count for m in metas.values())
        for p, meta in metas.items():
            records.setdefault(p, []).extend(got[: meta.count])
            got = got[meta.count :]
        history.append(metas)
        last = {**last, **metas}
    raise AssertionError("unreachable")


def sample(spout: Any) -> tuple[list[Any], int]:
    """The sample's records, and the Spark tasks that read it."""
    frame = spout.sample_batch()
    return rows(frame), frame.rdd.getNumPartitions()
