"""Throughput of exactly-once on the tweet topology: this framework against Spark
Structured Streaming (the alternative users would pick) and a bare Spark batch job (the
ceiling), measured in one run on one dataset with the same counting and the same sinks.

Run with ``make bench`` (or ``python -m benchmarks.bench --help``). It prints a table
and writes ``benchmarks/RESULTS.md``. Figures are medians of ``--repeat`` runs after one
warm-up; Spark's start-up is excluded everywhere (one session serves every case).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.breakdown import FLOOR_WARM_UP
from benchmarks.breakdown import TXIDS as BREAKDOWN_TXIDS
from benchmarks.breakdown import WARM_UP as BREAKDOWN_WARM_UP
from benchmarks.cases import (
    WEAKER,
    Case,
    bare_spark,
    batches_in_a_loop,
    framework,
    structured_streaming,
)
from benchmarks.connect import SIZES as CONNECT_SIZES
from benchmarks.connect import section as connect_section
from benchmarks.growth import (
    FIXED_RECORDS,
    FIXED_TXIDS,
    SIZES,
    draw_growth,
    draw_throughput,
    fixed_cost_table,
    growth_table,
    measure_fixed_cost,
    measure_growth,
)
from benchmarks.latency import SECONDS as LATENCY_SECONDS
from benchmarks.latency import WARM_UP_S as LATENCY_WARM_UP_S
from benchmarks.latency import measure as measure_latency
from benchmarks.latency import section as latency_section
from benchmarks.object_store import SIZES as OBJECT_STORE_SIZES
from benchmarks.object_store import s3_settings
from benchmarks.object_store import section as object_store_section
from benchmarks.overheads import overheads_section
from benchmarks.overlap import measure as measure_overlap
from benchmarks.redis_commit import commit_table
from benchmarks.report import (
    Result,
    cpu_table,
    guarantees_table,
    longer_auto_section,
    profile,
    table,
    targets,
)
from committers.redis._committer import GROUP_FIELDS
from committers.redis._send import STAGE_CHUNK
from tests.provenance import commit
from transactional.testing.servers import RedisServer, S3Server, ZooKeeperServer

#: The per-txid breakdown, in a process of its own (its session has Kafka's reader).
BREAKDOWN_COMMAND = (sys.executable, "-m", "benchmarks.breakdown", "--section")
#: The machine's cores, which the CPU figures are shares of.
CORES = os.cpu_count() or 1
WORK = Path(__file__).resolve().parent / ".work"
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
#: Hand-written reading of the figures (what was changed, why a target is missed),
#: kept in git and appended to every RESULTS.md so a new run does not lose it.
ANALYSIS = Path(__file__).resolve().parent / "analysis.md"


def dataset(tweets: int, partitions: int) -> Path:
    """Generated once per size and kept under benchmarks/.work (git-ignored)."""
    from examples.tweets.cli import main as demo

    path = WORK / f"tweets-{tweets}-{partitions}"
    if not (path / ".complete").exists():
        shutil.rmtree(path, ignore_errors=True)
        code = demo(
            [
                "generate",
                "--count",
                str(tweets),
                "--seed",
                "2026",
                "--partitions",
                str(partitions),
                "--bad-rate",
                "0.001",
                "--out",
                str(path),
            ],
            out=io.StringIO(),
        )
        if code != 0:
            raise SystemExit("generating the dataset failed")
        (path / ".complete").touch()
    return path


def machine() -> str:
    import pyspark

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, PySpark {pyspark.__version__}"
    )


def warm_up(cases: list[Case], progress: Callable[[str], None]) -> None:
    """One untimed run of each case: the JIT of its code paths, Delta's classes and
    caches, the Python workers."""
    for case in cases:
        started = time.perf_counter()
        case.run()
        progress(f"warm-up {case.name} [{case.sink}]: {time.perf_counter() - started:.1f}s")


def cpu_seconds() -> float:
    """Core-seconds of CPU used so far by this process and every process under it (Spark's
    JVM, its Python workers, the Redis and ZooKeeper servers), the exited ones included
    (reaped, they count in their parent's children times)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            t = process.cpu_times()
        except psutil.Error:  # ended meanwhile: its time moves to its parent's children
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def serpentine(count: int, repeat: int) -> list[list[int]]:
    """The order of the cases in each repetition: forward, then backward, and so on.
    A case run right after another comes out up to 10% faster or slower for that
    alone (analysis.md, eleventh round); alternating the direction puts each case
    after a different neighbour and, over an even number of repetitions, at each end
    of the order as often, so no case keeps the position that favours it."""
    forward = list(range(count))
    return [forward if i % 2 == 0 else forward[::-1] for i in range(repeat)]


def measure_paired(cases: list[Case], repeat: int, progress: Callable[[str], None]) -> list[Result]:
    """Each repetition runs every case once, in turn (``serpentine`` order), so that
    the machine's drift (a shared machine slows down and speeds up by 10% or more
    within minutes) falls on all of them alike instead of on whichever case ran during
    a slow spell."""
    results = [Result(c.name, c.sink, note=c.note) for c in cases]
    for i, order in enumerate(serpentine(len(cases), repeat)):
        for case, result in ((cases[k], results[k]) for k in order):
            cpu = cpu_seconds()
            started = time.perf_counter()
            result.records = case.run()
            result.seconds.append(time.perf_counter() - started)
            result.cpu.append(cpu_seconds() - cpu)
            result.timings = list(case.timings)
            progress(
                f"{case.name} [{case.sink}] paired run {i + 1}/{repeat}: {result.seconds[-1]:.1f}s"
            )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make bench", description=__doc__)
    parser.add_argument("--tweets", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--sinks", default="redis,delta")
    parser.add_argument("--quick", action="store_true", help="100k tweets, one repetition")
    parser.add_argument("--no-overheads", action="store_true")
    parser.add_argument(
        "--growth-sizes",
        default=",".join(str(n) for n in SIZES),
        help="records per txid of the growth section (comma-separated; empty: skip it)",
    )
    parser.add_argument(
        "--redis-commit-sizes",
        default="10000,100000,1000000",
        help="keys per commit of the Redis commit section (comma-separated; empty: skip it)",
    )
    parser.add_argument(
        "--fixed-txids",
        type=int,
        default=FIXED_TXIDS,
        help=f"txids of {FIXED_RECORDS} records in the fixed-cost section (0: skip it)",
    )
    parser.add_argument(
        "--auto-tweets",
        type=int,
        default=3_000_000,
        help="tweets of the longer --batch-size auto run against the fixed size, on Redis "
        "(0: skip it)",
    )
    parser.add_argument(
        "--overlap-delay-ms",
        type=float,
        default=300.0,
        help="how far away the Redis server of the overlapping-commits section is, in ms "
        "(benchmarks.overlap; 0: skip it)",
    )
    parser.add_argument(
        "--object-store-sizes",
        default=",".join(str(n) for n in OBJECT_STORE_SIZES),
        help="sums per txid of the Delta-in-S3 section (benchmarks.object_store; "
        "comma-separated; empty: skip it)",
    )
    parser.add_argument(
        "--connect-sizes",
        default=",".join(str(n) for n in CONNECT_SIZES),
        help="sums per txid of the Spark Connect section (benchmarks.connect: the commit "
        "path on both sinks, Connect against classic; comma-separated; empty: skip it)",
    )
    parser.add_argument(
        "--latency-seconds",
        type=float,
        default=LATENCY_SECONDS,
        help="measured seconds of the latency section, Kafka to Redis against Structured "
        "Streaming (benchmarks.latency; 0: skip it)",
    )
    parser.add_argument(
        "--latency-warm-up",
        type=float,
        default=LATENCY_WARM_UP_S,
        help="seconds each latency case runs before its measured window (its JVM warms up)",
    )
    parser.add_argument(
        "--breakdown-txids",
        type=int,
        default=BREAKDOWN_TXIDS,
        help="txids of each size in the per-txid breakdown (benchmarks.breakdown; 0: skip it)",
    )
    parser.add_argument(
        "--breakdown-warm-up",
        type=int,
        default=BREAKDOWN_WARM_UP,
        help="small txids the breakdown runs first, unmeasured, for the JVM to warm up",
    )
    parser.add_argument(
        "--only",
        metavar="TEXT",
        action="append",
        help="run only the cases whose name holds TEXT (e.g. 'max_pending=4'); repeat it "
        "for the cases that hold any of them",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.tweets, args.repeat = 100_000, 1
        if args.auto_tweets == 3_000_000:
            args.auto_tweets = 300_000
        if args.growth_sizes == ",".join(str(n) for n in SIZES):
            args.growth_sizes = "1000,10000"
        if args.fixed_txids == FIXED_TXIDS:
            args.fixed_txids = 20
        if args.redis_commit_sizes == "10000,100000,1000000":
            args.redis_commit_sizes = "10000,100000"
        if args.object_store_sizes == ",".join(str(n) for n in OBJECT_STORE_SIZES):
            args.object_store_sizes = "1000,10000"
        if args.connect_sizes == ",".join(str(n) for n in CONNECT_SIZES):
            args.connect_sizes = "1000,10000"
        if args.latency_seconds == LATENCY_SECONDS:
            args.latency_seconds = 15
        if args.latency_warm_up == LATENCY_WARM_UP_S:
            args.latency_warm_up = 10
        if args.breakdown_txids == BREAKDOWN_TXIDS:
            args.breakdown_txids = 5
        if args.breakdown_warm_up == BREAKDOWN_WARM_UP:
            args.breakdown_warm_up = 5

    from committers import delta_spark_conf
    from transactional.spark.session import create_spark_session, merged
    from transactional.spark.storage import s3_spark_conf

    def progress(line: str) -> None:
        print(f"[{datetime.now(UTC):%H:%M:%S}] {line}", file=sys.stderr, flush=True)

    WORK.mkdir(parents=True, exist_ok=True)
    progress(f"dataset: {args.tweets:,} tweets in {args.partitions} files")
    data = dataset(args.tweets, args.partitions)
    redis_server, zookeeper, s3 = RedisServer(), ZooKeeperServer(), S3Server()
    redis_server.start()
    zookeeper.start()
    s3.start()
    latency: list[str] = []
    try:
        # Before the throughput cases' session starts: each consumer runs alone.
        if args.latency_seconds and args.only is None:
            latency = latency_section(
                measure_latency(
                    progress,
                    args.latency_seconds,
                    warm_up=args.latency_warm_up,
                    redis_url=redis_server.url,
                ),
                args.latency_seconds,
                warm_up=args.latency_warm_up,
            )
            print("\n".join(latency))
        if args.breakdown_txids and args.only is None:
            progress("breakdown: a small and a large txid, step by step (its own process)")
            latency += subprocess.run(
                [
                    *BREAKDOWN_COMMAND,
                    *("--txids", str(args.breakdown_txids)),
                    *("--warm-up", str(args.breakdown_warm_up)),
                    # The floor's own warm-up: as short as the txids' in a quick run.
                    *("--floor-warm-up", str(min(args.breakdown_warm_up, FLOOR_WARM_UP))),
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.splitlines()
        # The S3 stand-in's settings before the session starts: its JVM reads them once.
        with s3_settings(s3):
            spark = create_spark_session(
                "local[*]", "bench", merged(delta_spark_conf(), s3_spark_conf())
            )
    except BaseException:
        redis_server.close()
        zookeeper.close()
        s3.close()
        raise
    try:
        per_txid = args.tweets // args.partitions  # Structured Streaming: one file a trigger
        results: list[Result] = []
        for sink in args.sinks.split(","):
            env = {
                "spark": spark,
                "data": data,
                "sink": sink,
                "redis_url": redis_server.url,
                "work": WORK / "runs",
                "partitions": args.partitions,
                "per_txid": per_txid,
            }
            cases = [
                bare_spark(**env),
                structured_streaming(**env),
                # The bound it gives matters where the target against Structured
                # Streaming is close (Redis); on Delta its MERGEs would add 4 minutes.
                *([batches_in_a_loop(**env)] if sink == "redis" else []),
                framework(**env, max_pending=1),
                framework(**env, max_pending=4),
                framework(**env, max_pending=4, sequence=True),
                framework(**env, max_pending=4, check_determinism=False),
                framework(**env, max_pending=4, ledger=False),
                framework(**env, max_pending=4, auto=True),
                *(framework(**env, max_pending=4, guarantee=g) for g in WEAKER),
            ]
            chosen = [c for c in cases if args.only is None or any(t in c.name for t in args.only)]
            warm_up(chosen, progress)
            results += measure_paired(chosen, args.repeat, progress)
        longer: list[str] = []
        if args.auto_tweets and "redis" in args.sinks.split(",") and args.only is None:
            progress(f"dataset: {args.auto_tweets:,} tweets in {args.partitions} files")
            env = {
                **env,
                "sink": "redis",
                "data": dataset(args.auto_tweets, args.partitions),
            }
            pair = [framework(**env, max_pending=4), framework(**env, max_pending=4, auto=True)]
            longer = longer_auto_section(
                measure_paired(pair, args.repeat, progress), args.auto_tweets, per_txid
            )
        lines = table(results)
        print("\n".join(lines))
        print("\n".join(guarantees_table(results)))
        rates = [(r.sink, r.name, r.rate) for r in results]
        figures = ["![Throughput per case and sink](throughput.png)", ""] if rates else []
        if rates:
            draw_throughput(rates, RESULTS.parent / "throughput.png")
        growth: list[str] = []
        sizes = [int(x) for x in args.growth_sizes.split(",") if x.strip()]
        if sizes:
            grown = measure_growth(
                spark,
                redis_server.url,
                args.sinks.split(","),
                sizes,
                dataset,
                WORK / "growth",
                progress,
            )
            draw_growth(grown, RESULTS.parent / "growth.png")
            growth = [
                "## How a txid's cost grows with its size (max_pending=1, medians per txid)",
                "",
                *growth_table(grown),
                "",
                "![Time per txid by step against records per txid](growth.png)",
                "",
            ]
        fixed: list[str] = []
        if args.fixed_txids:
            costs = measure_fixed_cost(
                spark,
                redis_server.url,
                args.sinks.split(","),
                dataset,
                WORK / "fixed",
                progress,
                args.fixed_txids,
            )
            fixed = [
                f"## Fixed cost per txid ({FIXED_RECORDS}-record txids)",
                "",
                *fixed_cost_table(costs),
                "",
            ]
        commit_sizes = [int(x) for x in args.redis_commit_sizes.split(",") if x.strip()]
        if commit_sizes and "redis" in args.sinks.split(","):
            fixed += [
                "## Redis commit time by keys per commit",
                "",
                *commit_table(redis_server.url, commit_sizes, progress),
                "",
                "One script call per commit (a group's too); above "
                f"{STAGE_CHUNK:,} fields a hash is staged first, as a list of JSON "
                f"chunks of {STAGE_CHUNK:,} fields, pipelined. Half of each commit's keys "
                "are already held. The runner groups only txids of at most "
                f"{GROUP_FIELDS:,} fields: the script's work is per field either way.",
                "",
            ]
        store_sizes = [int(x) for x in args.object_store_sizes.split(",") if x.strip()]
        if store_sizes and "delta" in args.sinks.split(",") and args.only is None:
            with s3_settings(s3):
                fixed += object_store_section(spark, s3, store_sizes, 5, progress)
        connect_sizes = [int(x) for x in args.connect_sizes.split(",") if x.strip()]
        if connect_sizes and args.only is None:  # its own processes: a server, two clients
            fixed += connect_section(connect_sizes, 5, progress)
        overlap: list[str] = []
        if args.overlap_delay_ms and "redis" in args.sinks.split(",") and args.only is None:
            overlap = [
                "## Commits on a latency-bound path (overlapping commits)",
                "",
                *measure_overlap(
                    spark, redis_server.port, args.overlap_delay_ms, 40, args.repeat, progress
                ),
                "",
                "A proxy on loopback delays every request to Redis (`tests.latency`); "
                "'commits at once' is the most requests it saw waiting for Redis together. "
                "Under at_least_once a committer whose commits commute lets up to "
                "max_pending of them run at once (`Committer.overlapping_commits`); see "
                "`benchmarks/overlap.py`.",
                "",
            ]
        sections = [
            "# Benchmark results",
            "",
            f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at commit `{commit()}` on {machine()}.",
            f"Dataset: {args.tweets:,} generated tweets in {args.partitions} JSON Lines files; "
            f"{args.repeat} timed runs per case after a warm-up run of each, the cases taken in "
            "turn in each repetition, forward and backward alternately; medians.",
            f"Command: `{' '.join(['python -m benchmarks.bench', *(argv or sys.argv[1:])])}`",
            "",
            "## Throughput, exactly-once",
            "",
            *lines,
            "",
            *figures,
            *[f"- {r.name} [{r.sink}]: {r.note}" for r in results if r.note],
            "",
            "## The three guarantees (same data, same repetitions)",
            "",
            *guarantees_table(results),
            "",
            "at_least_once and at_most_once skip the determinism checksum (its digest in "
            "the materialising job and its store write) and the sinks' last-txid check; "
            "the rest of a txid's path is the same (see docs/architecture.md, Three "
            "guarantees).",
            "",
            *overlap,
            "## CPU per run (medians)",
            "",
            *cpu_table(results, CORES),
            "",
            "CPU: core-seconds used by the benchmark's process and every process under it "
            "(Spark's JVM and Python workers, the Redis server) during the run; cores busy: "
            f"that over the run's wall time times the {CORES} cores.",
            "",
            "## Where a framework txid's time goes (last timed run, medians per txid)",
            "",
            *profile(results),
            "",
            "## Targets",
            "",
            *targets(results, CORES),
            "",
            *longer,
            *growth,
            *fixed,
            *latency,
        ]
        # Written now and again below: a failure in the overheads keeps the throughput.
        RESULTS.write_text("\n".join(sections) + "\n")
        if not args.no_overheads:
            sections += ["", *overheads_section(spark, redis_server.url, zookeeper.hosts, progress)]
        if ANALYSIS.exists():
            sections += ["", ANALYSIS.read_text().rstrip()]
        RESULTS.write_text("\n".join(sections) + "\n")
        print(json.dumps({"written": str(RESULTS)}))
    finally:
        spark.stop()
        redis_server.close()
        zookeeper.close()
        s3.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Any", "main"]
