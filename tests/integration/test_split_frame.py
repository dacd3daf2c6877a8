"""A batch's splits as Spark tasks (``split_frame``): each task reads its own
consecutive splits, in order, as ``parallelize`` slices a list, with their values as
given, and no split's text is in the plan Spark prints and logs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from transactional.sources.base import split_frame

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

pytestmark = [pytest.mark.integration, pytest.mark.connect]

SCHEMA = "n LONG, name STRING, data BINARY, maybe LONG, `price` DECIMAL(10, 2)"
OUTPUT = "task INT, n LONG, name STRING, data BINARY, maybe LONG, price STRING"


def _rows(count: int) -> list[tuple[Any, ...]]:
    return [
        (i, f"secret-split-{i}", bytes([i, 255 - i]), None if i % 3 else i * 10, Decimal(f"{i}.5"))
        for i in range(count)
    ]


def _frame(spark: Any, rows: list[tuple[Any, ...]], tasks: int | None) -> Any:
    import pyarrow as pa

    out = pa.schema(
        [
            ("task", pa.int32()),
            ("n", pa.int64()),
            ("name", pa.string()),
            ("data", pa.binary()),
            ("maybe", pa.int64()),
            ("price", pa.string()),
        ]
    )

    def echo(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Defined here so that Spark pickles it by value (tests/ is not installed).
        from pyspark import TaskContext

        task = TaskContext.get().partitionId()
        for batch in batches:
            records = [
                {**row, "task": task, "price": str(row["price"])} for row in batch.to_pylist()
            ]
            yield pa.RecordBatch.from_pylist(records, schema=out)

    return split_frame(spark, rows, SCHEMA, echo, tasks, OUTPUT)


@pytest.mark.parametrize("tasks", [None, 4])
def test_each_task_reads_its_own_consecutive_splits_in_order(spark: Any, tasks: int | None) -> None:
    rows = _rows(11)
    count = tasks or len(rows)
    # parallelize's slices: task p holds rows [p * n // count, (p + 1) * n // count).
    expected = [
        (p, *rows[i][:4], str(rows[i][4].quantize(Decimal("0.01"))))
        for p in range(count)
        for i in range(p * len(rows) // count, (p + 1) * len(rows) // count)
    ]
    got = [tuple(r) for r in _frame(spark, rows, tasks).collect()]
    assert [(t, n, name, bytes(data), maybe, price) for t, n, name, data, maybe, price in got] == (
        expected
    )


def test_no_split_is_in_the_plan(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    frame = _frame(spark, _rows(3), None)
    frame.explain(True)
    plan = capsys.readouterr().out
    assert "MapInArrow" in plan or "mapinarrow" in plan.lower()
    assert "secret-split" not in plan
