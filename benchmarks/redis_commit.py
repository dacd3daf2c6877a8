"""The Redis committer's commit, by number of keys: one txid's commit (one script call),
and a commit group of four txids (one script call for all four) against the same four
txids committed one by one. Each commit adds to a namespace that already holds half of
its keys; the figures are seconds, and seconds per 10,000 keys. No Spark: the prepared
batches are built here, as ``prepare`` hands them over.

    python -m benchmarks.redis_commit [--sizes 10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from committers import CounterTable, RedisCommitter
from committers.redis._batch import RedisBatch
from transactional.committer import CommitterContext
from transactional.testing.servers import RedisServer
from transactional.types import CommitMode, TransactionAttempt

TABLE = CounterTable("sums", ("k",), "n")


def batch(txid: int, first_key: int, keys: int) -> RedisBatch:
    return RedisBatch.of(txid, {"sums": {f"key{k}": 1 for k in range(first_key, first_key + keys)}})


def one_size(url: str, size: int, mode: CommitMode) -> dict[str, float]:
    """Seconds: ``single`` (one txid of ``size`` keys), ``alone`` (four txids of
    ``size / 4`` keys each, one commit each), ``group`` (the same four as one group)."""
    times: dict[str, float] = {}
    for case in ("single", "alone", "group"):
        sink = RedisCommitter(url, {"in": TABLE}, mode=mode, namespace=f"bench:{size}:{case}")
        sink.open(CommitterContext(None, "bench", "redis", fence_token=1))
        client = sink._connection.server()
        client.delete("sums")
        sink.commit(TransactionAttempt(1, 1), batch(1, 0, size))  # the keys already held
        quarter = size // 4
        attempts = [TransactionAttempt(t, t) for t in range(2, 6)]
        parts = [batch(t, size // 2 + i * quarter, quarter) for i, t in enumerate(range(2, 6))]
        began = time.perf_counter()
        if case == "single":
            sink.commit(attempts[0], batch(2, size // 2, size))
        elif case == "alone":
            for attempt, part in zip(attempts, parts, strict=True):
                sink.commit(attempt, part)
        else:
            sink.commit_group(attempts, parts)
        times[case] = time.perf_counter() - began
        client.delete("sums")
        for key in client.scan_iter(f"bench:{size}:{case}:*"):
            client.delete(key)
        sink.close()
    return times


def commit_table(
    url: str, sizes: list[int], progress: Callable[[str], None] | None = None
) -> list[str]:
    """The figures as a Markdown table (the Redis at ``url``; its namespaces are
    ``bench:*``)."""
    say = progress or (lambda line: None)
    lines = [
        "| keys | mode | one txid s | s per 10k keys | 4 txids, one commit each s | "
        "4 txids as one group s | s per 10k keys (group) |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    one_size(url, 1000, CommitMode.TRANSACTIONAL)  # warm-up: the script cached
    for size in sizes:
        for mode in CommitMode:
            t = one_size(url, size, mode)
            say(f"redis commit: {size:,} keys {mode.value}: {t}")
            per = 10_000 / size
            lines.append(
                f"| {size:,} | {mode.value} | {t['single']:.3f} | {t['single'] * per:.3f} | "
                f"{t['alone']:.3f} | {t['group']:.3f} | {t['group'] * per:.3f} |"
            )
    return lines


def main(argv: list[str] | None = None, progress: Callable[[str], None] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.redis_commit", description=__doc__)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    args = parser.parse_args(argv)
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    server = RedisServer()
    server.start()
    try:
        lines = commit_table(server.url, [int(x) for x in args.sizes.split(",")], say)
    finally:
        server.close()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
