"""The Delta committer's two commit paths side by side, by size of a txid's per-key sums:
delta-rs from the driver (the sums collected as Arrow) and delta-spark's MERGE from the
executors. For each size, a table is first filled with that many keys, then one txid of
as many sums (half of them keys the table holds) is prepared and committed; the figures
are that txid's prepare and commit seconds, and the driver's memory (RSS of this Python
process) before and at its peak during the commit. ``DeltaCommitter``'s
``max_driver_rows`` default is chosen from these figures.

    python -m benchmarks.delta_paths [--sizes 10000,100000,1000000,3000000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.growth import peak_rss
from committers import CounterTable, DeltaCommitter, delta_spark_conf
from transactional.committer import CommitterContext
from transactional.types import TransactionAttempt

WORK = Path(__file__).resolve().parent / ".work" / "delta_paths"
TABLE = CounterTable("sums", ("k",), "n")


def one_size(spark: Any, size: int, driver_rows: int) -> dict[str, float]:
    path = WORK / f"{size}-{driver_rows}"
    shutil.rmtree(path, ignore_errors=True)
    sink = DeltaCommitter(str(path), {"in": TABLE}, max_driver_rows=driver_rows)
    sink.open(CommitterContext(spark, "bench", "paths"))

    def batch(first: int) -> dict[str, Any]:
        keys = spark.range(first, first + size).selectExpr("CONCAT('key', id) AS k", "1L AS n")
        return {"in": keys}

    at = TransactionAttempt(1, 1)
    sink.commit(at, sink.prepare(at, batch(0)))
    at = TransactionAttempt(2, 1)
    began = time.perf_counter()
    prepared = sink.prepare(at, batch(size // 2))
    prepare_s = time.perf_counter() - began
    with peak_rss(None) as peak:
        before = peak[0]
        began = time.perf_counter()
        sink.commit(at, prepared)
        commit_s = time.perf_counter() - began
    sink.close()
    shutil.rmtree(path, ignore_errors=True)
    return {"prepare": prepare_s, "commit": commit_s, "rss": before, "peak": peak[0]}


def main(argv: list[str] | None = None, progress: Callable[[str], None] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.delta_paths", description=__doc__)
    parser.add_argument("--sizes", default="10000,100000,1000000,3000000")
    args = parser.parse_args(argv)
    from transactional.spark.session import create_spark_session

    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    spark = create_spark_session("local[*]", "delta-paths", delta_spark_conf())
    lines = [
        "| sums per txid | delta-rs prepare s | delta-rs commit s | driver RSS MiB (peak in "
        "commit) | delta-spark prepare s | delta-spark commit s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    try:
        one_size(spark, 1000, 10**9)  # warm-up: classes, codegen, Python workers
        for size in (int(x) for x in args.sizes.split(",")):
            rs = one_size(spark, size, 10**9)
            say(f"{size:,} sums: delta-rs {rs}")
            sp = one_size(spark, size, 0)
            say(f"{size:,} sums: delta-spark {sp}")
            lines.append(
                f"| {size:,} | {rs['prepare']:.2f} | {rs['commit']:.2f} | "
                f"{rs['rss']:.0f} ({rs['peak']:.0f}) | {sp['prepare']:.2f} | {sp['commit']:.2f} |"
            )
    finally:
        spark.stop()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
