"""A Delta commit in S3 against the same commit on local disk: the Delta committer's
delta-rs path (the only one it takes in S3), txids of a given number of per-key sums
(half of them keys the table already holds), committed one after the other into a
local directory and into a bucket of moto's S3 server on loopback. The figures are each
txid's prepare and commit seconds (medians over ``--txids``, after a first txid that
fills the table) and the requests the store answered per commit.

moto is a Python server on the same two cores: it has none of S3's network latency
(tens of milliseconds per request) and adds its own CPU, so the S3 column says how many
round trips and how much work a commit costs there, not what it costs against AWS.

    python -m benchmarks.object_store [--sizes 1000,10000,100000] [--txids 5]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from committers import CounterTable, DeltaCommitter
from transactional.committer import CommitterContext
from transactional.testing.servers import S3Server
from transactional.types import TransactionAttempt

WORK = Path(__file__).resolve().parent / ".work" / "object_store"
TABLE = CounterTable("sums", ("k",), "n")
SIZES = (1000, 10_000, 100_000)

Progress = Callable[[str], None]


@contextmanager
def s3_settings(server: S3Server) -> Iterator[Mapping[str, str]]:
    """The server's standard AWS settings in this process's environment, while it lasts
    (the Spark session must start inside: its JVM reads them once)."""
    saved = {name: os.environ.get(name) for name in server.settings}
    os.environ.update(server.settings)
    try:
        yield server.settings
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def requests_served(server: S3Server) -> int:
    """The HTTP requests moto has logged so far (one line per request in its log)."""
    path = server.dir / f"{server.name}.log"
    log = path.read_text(errors="replace") if path.exists() else ""
    return len(re.findall(r'"(?:GET|PUT|POST|HEAD|DELETE) ', log))


def one_place(
    spark: Any, location: str, size: int, txids: int, count: Callable[[], int] | None
) -> dict[str, float]:
    sink = DeltaCommitter(location, {"in": TABLE})
    sink.open(CommitterContext(spark, "bench", "object-store"))

    def batch(first: int) -> dict[str, Any]:
        keys = spark.range(first, first + size).selectExpr("CONCAT('key', id) AS k", "1L AS n")
        return {"in": keys}

    prepares, commits, requests = [], [], []
    for txid in range(1, txids + 2):
        at = TransactionAttempt(txid, 1)
        began = time.perf_counter()
        prepared = sink.prepare(at, batch((txid - 1) * size // 2))
        prepared_s = time.perf_counter() - began
        before = count() if count else 0
        began = time.perf_counter()
        sink.commit(at, prepared)
        commit_s = time.perf_counter() - began
        if txid > 1:  # the first fills the table
            prepares.append(prepared_s)
            commits.append(commit_s)
            requests.append((count() if count else 0) - before)
    sink.close()
    return {
        "prepare": statistics.median(prepares),
        "commit": statistics.median(commits),
        "requests": statistics.median(requests),
    }


def measure(
    spark: Any, server: S3Server, sizes: list[int], txids: int, progress: Progress
) -> list[str]:
    """The section's table: per size, local and S3 side by side."""
    bucket = server.bucket()
    shutil.rmtree(WORK, ignore_errors=True)
    lines = [
        "| sums per txid | local prepare s | local commit s | S3 prepare s | S3 commit s | "
        "S3 / local commit | S3 requests per commit |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    one_place(spark, str(WORK / "warm"), 1000, 1, None)  # classes, codegen, workers
    for size in sizes:
        local = one_place(spark, str(WORK / f"local-{size}"), size, txids, None)
        progress(f"object store: {size:,} sums locally: {local}")
        s3 = one_place(
            spark, f"s3://{bucket}/t-{size}", size, txids, lambda: requests_served(server)
        )
        progress(f"object store: {size:,} sums in S3 (moto): {s3}")
        lines.append(
            f"| {size:,} | {local['prepare']:.2f} | {local['commit']:.2f} | "
            f"{s3['prepare']:.2f} | {s3['commit']:.2f} | {s3['commit'] / local['commit']:.1f} | "
            f"{s3['requests']:.0f} |"
        )
    shutil.rmtree(WORK, ignore_errors=True)
    return lines


def section(
    spark: Any, server: S3Server, sizes: list[int], txids: int, progress: Progress
) -> list[str]:
    return [
        "## A Delta commit in S3 (moto on loopback) against local disk",
        "",
        *measure(spark, server, sizes, txids, progress),
        "",
        f"Medians over {txids} txids after one that fills the table; half of each txid's "
        "keys are already in the table. Both through delta-rs on the driver, the only "
        "writer the committer uses in S3 (a conditional PUT of the log entry). moto is a "
        "Python server on the same cores, without S3's network latency: the requests "
        "column is what carries over to AWS (about 20-100 ms each there).",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.object_store", description=__doc__)
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--txids", type=int, default=5)
    args = parser.parse_args(argv)
    from committers import delta_spark_conf
    from transactional.spark.session import create_spark_session, merged
    from transactional.spark.storage import s3_spark_conf

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    server = S3Server()
    server.start()
    try:
        with s3_settings(server):
            conf = merged(delta_spark_conf(), s3_spark_conf())
            spark = create_spark_session("local[*]", "object-store", conf)
            try:
                sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
                print("\n".join(section(spark, server, sizes, args.txids, say)))
            finally:
                spark.stop()
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
