"""The Spark engine: the determinism check's digest (``SparkEngine.materialise``): per
partition, the record count and the sum of each row's ``xxhash64``, checked against a
sum computed here in Python's integers from the row hashes Spark gives; independent of
row order and of a map's entry order; a changed value changes it. The batch is read once
and cut into few tasks; the committers' frames are collected whole, in the attempt's
job group."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import functions as F

from tests.witness import spark_settled
from transactional.errors import ContractError
from transactional.spark.engine import ROWS_PER_TASK, SparkEngine, collect_arrow
from transactional.spout import PARTITION_COLUMN

pytestmark = pytest.mark.integration

SCHEMA = "name string, n bigint, score double, tags map<string,int>"
ROWS = [
    ("a", 1, 0.5, {"x": 1, "y": 2}),
    ("b", -(2**62), -1e300, {}),
    (None, 2**62, None, None),
    ("a", 1, 0.5, {"x": 1, "y": 2}),  # a duplicate counts twice
    ("ü", 0, float("nan"), {"z": -3}),
] + [(f"r{i}", i * 7919, i / 3, {"k": i}) for i in range(300)]


def python_sum(spark: Any, rows: list[Any]) -> tuple[int, str]:
    """Count and sum of the row hashes, summed here (Python ints do not overflow)."""
    frame = spark.createDataFrame(rows, SCHEMA)
    hashes = frame.select(
        F.xxhash64("name", "n", "score", F.array_sort(F.map_entries("tags"))).alias("h")
    ).collect()
    return len(hashes), str(sum(int(r["h"]) for r in hashes))


def test_each_partition_digest_is_its_count_and_the_exact_sum_of_row_hashes(spark: Any) -> None:
    engine = SparkEngine(spark)
    first, second = ROWS[:200], ROWS[200:]
    frames = [spark.createDataFrame(first, SCHEMA), spark.createDataFrame(second, SCHEMA)]
    read = engine.materialise(frames, digest=True)
    assert read.records == len(ROWS)
    assert read.digests == {0: python_sum(spark, first), 1: python_sum(spark, second)}
    assert read.batch.count() == len(ROWS) and "__transactional_partition" not in read.batch.columns


def test_a_batch_of_one_frame_digests_as_that_partition_of_a_tagged_batch(spark: Any) -> None:
    """One frame is digested without a tag, in the one materialising job, to the same
    exact sums: a txid stored before (tagged) compares equal when it is replayed."""
    engine = SparkEngine(spark)
    frame = spark.createDataFrame(ROWS, SCHEMA)
    with engine.job_group("one-frame"):
        read = engine.materialise([frame], digest=True)
    spark_settled(spark)
    assert engine.jobs("one-frame") == 1
    assert read.digests == {0: python_sum(spark, ROWS)} and read.records == len(ROWS)
    tagged = engine.materialise([frame, spark.createDataFrame([], SCHEMA)], digest=True)
    assert tagged.digests is not None and tagged.digests[0] == read.digests[0]
    assert read.batch.columns == frame.columns
    empty = engine.materialise([spark.createDataFrame([], SCHEMA)], digest=True)
    assert empty.digests == {0: (0, "0")} and empty.records == 0


@pytest.mark.parametrize("after_large", [False, True])
@pytest.mark.parametrize("count", [1, 2, 17])
def test_digests_of_one_tagged_frame_are_grouped_by_the_tag(
    spark: Any, count: int, after_large: bool
) -> None:
    """The digests of a tagged frame are each partition's exact sums, whatever Spark's
    own partitioning of the rows: observed (up to 16 partitions, after a small batch)
    or from a ``groupBy`` on the tag (more, or after a batch larger than a task)."""
    engine = SparkEngine(spark)
    if after_large:
        engine.materialise([spark.range(ROWS_PER_TASK + 1)] * 2, digest=True)
    parts = {p: ROWS[p::count] for p in range(count)}
    tagged = [(*row, p) for p, rows in parts.items() for row in rows]
    frame = spark.createDataFrame(tagged, f"{SCHEMA}, {PARTITION_COLUMN} long").repartition(3)
    read = engine.materialise([frame], digest=True, partitions=count + 1)
    want = {p: python_sum(spark, rows) for p, rows in parts.items()} | {count: (0, "0")}
    assert read.digests == want and read.records == len(ROWS)


@pytest.mark.parametrize("count", [1, 2, 17])
@pytest.mark.parametrize("tag", [-1, "past", None])
def test_a_row_tagged_with_no_partition_of_the_batch_is_refused(
    spark: Any, count: int, tag: Any
) -> None:
    engine = SparkEngine(spark)
    stray = count if tag == "past" else tag
    rows = [(*row, i % count) for i, row in enumerate(ROWS[:50])] + [(*ROWS[60], stray)]
    frame = spark.createDataFrame(rows, f"{SCHEMA}, {PARTITION_COLUMN} long")
    which = "no partition" if stray is None else f"partition {stray}"
    with pytest.raises(ContractError, match=f"tagged with {which} in "):
        engine.materialise([frame], digest=True, partitions=count)


def test_materialising_runs_one_job_or_two_when_grouped(spark: Any) -> None:
    """The count (and a single frame's digest) is observed while the rows are kept: one
    Spark job, where a count would add a shuffle. Several frames' digests are observed
    too while the batch before fitted a task (``ROWS_PER_TASK``); after a larger one
    they come from one aggregation by the tag: its map stage keeps the rows, then the
    result stage (two jobs with adaptive execution). Both ways give the same digests."""
    engine = SparkEngine(spark)
    small = [spark.createDataFrame(ROWS[:100], SCHEMA), spark.createDataFrame(ROWS[100:], SCHEMA)]
    half = ROWS_PER_TASK // 2 + 1
    large = [spark.range(half).selectExpr("id", "id % 7 AS k") for _ in range(2)]
    cases = [
        (small, False, 1),
        (small[:1], True, 1),
        (small, True, 1),  # the batches before were small: observed
        (large, True, 1),  # so was the one before this
        (large, True, 2),  # after a large one: grouped
        (small, True, 2),
        (small, True, 1),
    ]
    seen: dict[int, list[Any]] = {}
    for n, (given, digest, jobs) in enumerate(cases):
        group = f"materialise-jobs-{n}"
        with engine.job_group(group):
            read = engine.materialise(given, digest=digest)
        assert read.records == sum(f.count() for f in given)
        spark_settled(spark)
        assert engine.jobs(group) == jobs, n
        if digest and len(given) == 2:
            seen.setdefault(id(given), []).append(read.digests)
    assert all(len(set(map(str, digests))) == 1 for digests in seen.values())
    assert len(seen[id(small)]) == 3 and len(seen[id(large)]) == 2


def test_the_digest_ignores_row_and_map_entry_order_but_not_values(spark: Any) -> None:
    engine = SparkEngine(spark)

    def digest(rows: list[Any]) -> Any:
        frame = spark.createDataFrame(rows, SCHEMA).repartition(3)
        digests = engine.materialise([frame], digest=True).digests
        assert digests is not None
        return digests[0]

    reordered = [(n, i, s, dict(reversed(list(t.items()))) if t else t) for n, i, s, t in ROWS]
    assert digest(list(reversed(reordered))) == digest(ROWS)
    changed = list(ROWS)
    changed[7] = (changed[7][0], changed[7][1] + 1, changed[7][2], changed[7][3])
    assert digest(changed) != digest(ROWS)
    assert digest(ROWS[:-1])[0] == len(ROWS) - 1


def test_an_empty_partition_digests_to_zero(spark: Any) -> None:
    engine = SparkEngine(spark)
    frames = [spark.createDataFrame(ROWS[:3], SCHEMA), spark.createDataFrame([], SCHEMA)]
    read = engine.materialise(frames, digest=True)
    assert read.digests == {0: python_sum(spark, ROWS[:3]), 1: (0, "0")}


def test_frames_are_collected_whole_in_the_callers_job_group(spark: Any) -> None:
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # one job per plain scan
    try:
        frames = {
            f"f{i}": spark.range(i * 10, i * 10 + 5 + i).selectExpr("id", "CAST(id AS STRING) s")
            for i in range(4)
        }
        engine = SparkEngine(spark)
        with engine.job_group("collect-test"):
            got = collect_arrow(frames)
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")
    want = {
        f"f{i}": [{"id": n, "s": str(n)} for n in range(i * 10, i * 10 + 5 + i)] for i in range(4)
    }
    assert {name: table.to_pylist() for name, table in got.items()} == want
    # Each frame's job ran in the caller's group (so cancelling an attempt cancels it).
    spark_settled(spark)
    assert engine.jobs("collect-test") == len(frames)


def test_a_batch_is_read_once_and_by_one_task_per_rows_per_task(spark: Any) -> None:
    """``rand()`` differs at every read: equal sums prove later jobs read the kept rows."""
    engine = SparkEngine(spark)
    frames = [spark.range(0, 40, numPartitions=4).select("id", F.rand().alias("r"))] * 3
    read = engine.materialise(frames, digest=False)
    assert read.records == 120
    assert read.batch.rdd.getNumPartitions() == 1  # 12 partitions of 120 rows: one task
    first = read.batch.agg(F.sum("r")).collect()[0][0]
    assert read.batch.agg(F.sum("r")).collect()[0][0] == first
    big = engine.materialise([spark.range(0, ROWS_PER_TASK + 1, numPartitions=5)], digest=True)
    assert big.batch.rdd.getNumPartitions() == 2


@pytest.mark.parametrize("form", ["count", "one frame", "tagged"])
def test_a_deferred_batch_is_counted_by_the_first_job_that_reads_it(spark: Any, form: str) -> None:
    """``materialise(defer=True)`` runs no job: the batch comes back observed and as
    one task, and the first job that reads it (here the committers' collect would)
    counts and digests it exactly as the materialising job does; ``settle`` is that
    job, for when nothing else reads it."""
    first, second = ROWS[:200], ROWS[200:]
    frames = [spark.createDataFrame(first, SCHEMA)]
    if form == "tagged":
        frames.append(spark.createDataFrame(second, SCHEMA))
    want_records = len(first) + (len(second) if form == "tagged" else 0)
    want = {0: python_sum(spark, first)}
    if form == "tagged":
        want[1] = python_sum(spark, second)
    digest = form != "count"
    engine = SparkEngine(spark)
    with engine.job_group(f"deferred-materialise-{form}"):
        read = engine.materialise(frames, digest=digest, defer=True)
    assert read.pending is not None
    observation = read.pending.observation()
    with engine.job_group(f"deferred-read-{form}"):
        rows = read.pending.batch.groupBy("name").count().collect()
    spark_settled(spark)
    assert engine.jobs(f"deferred-materialise-{form}") is None
    assert engine.jobs(f"deferred-read-{form}") == 1
    assert sum(r["count"] for r in rows) == want_records
    done = read.pending.resolve(observation)
    assert done.records == want_records and done.pending is None
    assert done.digests == (want if digest else None)
    assert read.pending.batch.rdd.getNumPartitions() == 1

    again = engine.materialise(frames, digest=digest, defer=True)
    assert again.pending is not None
    settled = again.pending.settle()
    assert (settled.records, settled.digests) == (done.records, done.digests)
    classic = SparkEngine(spark).materialise(frames, digest=digest)
    assert (classic.records, classic.digests) == (done.records, done.digests)


def test_a_batch_is_not_deferred_after_a_large_one_nor_over_many_partitions(spark: Any) -> None:
    engine = SparkEngine(spark)
    many = [spark.range(2) for _ in range(17)]  # more than a small batch observes
    assert engine.materialise(many, digest=True, defer=True).pending is None
    engine.materialise([spark.range(ROWS_PER_TASK + 1)], digest=False)
    after = engine.materialise([spark.range(5)], digest=False, defer=True)
    assert after.pending is None and after.records == 5
    assert engine.materialise([spark.range(5)], digest=False, defer=True).pending is not None
