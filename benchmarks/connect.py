"""The commit path over Spark Connect against a classic session on the same machine:
each committer's ``prepare`` (the txid's per-key sums computed by Spark and collected
into the client as Arrow: what crosses the wire) and ``commit`` (delta-rs into a local
table, or Redis's script), for txids of a given number of sums (half of them keys the
sink already holds). The classic side is a ``local[2]`` session in a process of its
own; the Connect side a client process of a Spark Connect server on ``local[2]`` (a
process is either, never both). Medians over ``--txids`` txids after one that fills
the sink.

    python -m benchmarks.connect [--sizes 1000,10000,100000] [--txids 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(__file__).resolve().parent / ".work" / "connect"
SIZES = (1000, 10_000, 100_000)
SINKS = ("delta", "redis")

Progress = Callable[[str], None]


def one_sink(
    spark: Any, sink: str, target: str, size: int, txids: int, name: str
) -> dict[str, float]:
    """Medians of ``prepare`` and ``commit`` seconds of ``txids`` txids of ``size`` sums."""
    from committers import CounterTable, DeltaCommitter, RedisCommitter
    from transactional.committer import CommitterContext
    from transactional.types import TransactionAttempt

    table = CounterTable("sums", ("k",), "n")
    committer: Any = (
        DeltaCommitter(target, {"in": table})
        if sink == "delta"
        else RedisCommitter(target, {"in": table}, key_prefix=f"bench-{name}-{size}:")
    )
    committer.open(CommitterContext(spark, "bench", f"{name}-{size}"))
    prepares, commits = [], []
    for txid in range(1, txids + 2):
        first = (txid - 1) * size // 2
        keys = spark.range(first, first + size).selectExpr("CONCAT('key', id) AS k", "1L AS n")
        at = TransactionAttempt(txid, 1)
        began = time.perf_counter()
        prepared = committer.prepare(at, {"in": keys})
        prepared_s = time.perf_counter() - began
        began = time.perf_counter()
        committer.commit(at, prepared)
        if txid > 1:  # the first fills the sink
            prepares.append(prepared_s)
            commits.append(time.perf_counter() - began)
    committer.close()
    return {"prepare": statistics.median(prepares), "commit": statistics.median(commits)}


def side(remote: str | None, redis_url: str, sizes: list[int], txids: int) -> dict[str, Any]:
    """One side's figures (in this process: classic, or Connect's with ``remote``)."""
    from committers import delta_spark_conf
    from transactional.spark.session import create_spark_session

    name = "connect" if remote else "classic"
    spark = create_spark_session("local[2]", f"bench-{name}", delta_spark_conf(), remote=remote)
    try:
        one_sink(spark, "delta", str(WORK / name / "warm"), 1000, 1, name)  # classes, workers
        figures: dict[str, Any] = {}
        for sink in SINKS:
            for size in sizes:
                target = str(WORK / name / f"t-{size}") if sink == "delta" else redis_url
                figures[f"{sink}/{size}"] = one_sink(spark, sink, target, size, txids, name)
        return figures
    finally:
        spark.stop()


def _side_process(args: list[str], progress: Progress, what: str) -> dict[str, Any]:
    progress(f"connect: the {what} side")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.connect", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks.connect ({what}) failed:\n{done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def measure(sizes: list[int], txids: int, progress: Progress) -> list[str]:
    """The section's table: per sink and size, classic and Connect side by side."""
    from tests.jvm import driver_conf
    from transactional.testing.servers import RedisServer, SparkConnectServer

    shutil.rmtree(WORK, ignore_errors=True)
    redis = RedisServer()
    server = SparkConnectServer(conf=driver_conf(), python_path=str(ROOT))
    redis.start()
    server.start()
    try:
        common = ["--redis-url", redis.url, "--sizes", ",".join(map(str, sizes))]
        common += ["--txids", str(txids)]
        classic = _side_process(["--side", *common], progress, "classic")
        connect = _side_process(["--side", "--remote", server.remote, *common], progress, "Connect")
    finally:
        server.close()
        redis.close()
        shutil.rmtree(WORK, ignore_errors=True)
    lines = [
        "| sink | sums per txid | classic prepare s | classic commit s | Connect prepare s "
        "| Connect commit s | Connect / classic (prepare + commit) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for sink in SINKS:
        for size in sizes:
            a, b = classic[f"{sink}/{size}"], connect[f"{sink}/{size}"]
            ratio = (b["prepare"] + b["commit"]) / (a["prepare"] + a["commit"])
            lines.append(
                f"| {sink} | {size:,} | {a['prepare']:.3f} | {a['commit']:.3f} | "
                f"{b['prepare']:.3f} | {b['commit']:.3f} | {ratio:.2f} |"
            )
    return lines


def section(sizes: list[int], txids: int, progress: Progress) -> list[str]:
    return [
        "## The commit path over Spark Connect against a classic session",
        "",
        *measure(sizes, txids, progress),
        "",
        f"Medians over {txids} txids after one that fills the sink; half of each txid's "
        "keys are already held. prepare: Spark sums the txid and the client collects the "
        "sums as Arrow (over gRPC on Connect, through the driver's JVM otherwise); "
        "commit: delta-rs or Redis's script, from the client. Both sides on `local[2]` on "
        "the same machine, each in a process of its own; the Connect server on loopback.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.connect", description=__doc__)
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--txids", type=int, default=5)
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--remote", help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    if args.side:  # one side, in this process; its figures as JSON on the last line
        print(json.dumps(side(args.remote, args.redis_url, sizes, args.txids)))
        return 0

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    print("\n".join(section(sizes, args.txids, say)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
