"""``python -m benchmarks.determinism``: what the determinism check costs per txid.

The whole-run throughput of ``make bench`` moves by more than 5% from run to run on a
shared 2-core machine, which is the size of the effect to measure. So this measures the
check where it runs: one txid of the bench's workload (the tweet demo's partitioned
file spout, 125,000 tweets in 8 partitions by default) is read and materialised by
``SparkEngine.materialise`` with and without digests, alternately, ``--pairs`` times;
the median of the paired differences is the check's cost per txid (the one
``record_digest`` store write per txid it adds is measured by ``make bench``'s overheads
section, about a millisecond). It is reported against the median time per txid of the
framework's own run of the same txids (``max_pending=4``, Redis sink), which this also
measures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

#: The share of a txid's time the check may take.
TARGET = 0.05


def one_txid_frames(spark: Any, data: Path, per_partition: int) -> list[Any]:
    """The frames of txid 1 as the bench's spout emits them."""
    from transactional.sources.files import FilesPartitionedSpout
    from transactional.spout import SpoutContext
    from transactional.types import TransactionAttempt

    spout = FilesPartitionedSpout(data, per_partition)
    spout.open(SpoutContext(spark, "determinism", None))
    attempt = TransactionAttempt(1, 1)
    metas = [
        spout.emit_partition_batch_new(attempt, p, None) for p in range(spout.num_partitions())
    ]
    return [spout.emit_partition_batch(attempt, p, m) for p, m in enumerate(metas)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.determinism", description=__doc__)
    parser.add_argument("--tweets", type=int, default=1_000_000, help="dataset size")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--per-txid", type=int, default=125_000)
    parser.add_argument("--pairs", type=int, default=15)
    args = parser.parse_args(argv)

    from benchmarks.bench import WORK, dataset
    from benchmarks.cases import framework
    from committers import delta_spark_conf
    from transactional.spark.engine import SparkEngine
    from transactional.spark.session import create_spark_session
    from transactional.testing.servers import RedisServer

    data = dataset(args.tweets, args.partitions)
    spark = create_spark_session("local[*]", "determinism", delta_spark_conf())
    redis_server = RedisServer()
    redis_server.start()
    try:
        engine = SparkEngine(spark)
        frames = one_txid_frames(spark, data, args.per_txid // args.partitions)
        for digest in (False, True):  # warm up both paths
            engine.materialise(frames, digest)
        plain: list[float] = []
        checked: list[float] = []
        for i in range(args.pairs):
            for digest, into in (
                ((False, plain), (True, checked)) if i % 2 else ((True, checked), (False, plain))
            ):
                began = time.perf_counter()
                read = engine.materialise(frames, digest)
                into.append(time.perf_counter() - began)
                read.batch.unpersist()
        cost = statistics.median(c - p for c, p in zip(checked, plain, strict=True))

        case = framework(
            spark=spark,
            data=data,
            sink="redis",
            redis_url=redis_server.url,
            work=WORK / "runs",
            partitions=args.partitions,
            per_txid=args.per_txid,
            max_pending=4,
        )
        case.run()  # warm up
        began = time.perf_counter()
        case.run()
        elapsed = time.perf_counter() - began
        per_txid = elapsed / len(case.timings)
    finally:
        redis_server.close()
        spark.stop()
    share = cost / per_txid
    verdict = "met" if share < TARGET else "missed"
    print(f"records per txid: {args.per_txid:,} ({args.partitions} partitions)")
    print(f"materialise without digests: median {statistics.median(plain):.3f} s")
    print(f"materialise with digests:    median {statistics.median(checked):.3f} s")
    print(f"the check's cost per txid:   median {cost:+.3f} s over {args.pairs} pairs")
    print(f"a txid of the framework (max_pending=4, Redis): {per_txid:.2f} s")
    print(f"share: {share:+.1%} of a txid (target under {TARGET:.0%}: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
