"""The determinism check's digest on Spark (``SparkEngine.materialise``): per partition,
the record count and the sum of each row's ``xxhash64``, checked against a sum computed
here in Python's integers from the row hashes Spark gives; independent of row order and
of a map's entry order; a changed value changes it."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import functions as F

from transactional.engine import SparkEngine

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
