"""``python -m examples.tweets <command>``: generate, load, run, show.

Exit codes: 0 done; 1 the run failed (a batch failed on every attempt, a lost store
session, ...: the state is kept, fix the cause and run again to resume); 2 bad usage or
configuration, reported before anything is touched; 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from examples.tweets.progress import configure_logging, kv
from transactional.cli.settings import RUNNER_ONLY, add_flags
from transactional.errors import ConfigurationError, StoreUnavailableError, TransactionalError
from transactional.faults import FaultPoint

__all__ = ["build_parser", "main"]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within [0, 1], not {value}")
    return value


def _add_sink_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sink",
        choices=("delta", "redis", "both"),
        default="delta",
        help="where the counts go; both: Redis and Delta, two committers (default: delta)",
    )
    p.add_argument(
        "--delta-path", metavar="DIR", help="Delta tables directory (default: <state-dir>/delta)"
    )
    p.add_argument("--redis-url", metavar="URL", help="e.g. redis://127.0.0.1:6379/0")
    p.add_argument(
        "--redis-key-prefix",
        metavar="PREFIX",
        default="",
        help="before every Redis key the counts use; on a Redis Cluster give them one "
        "hash tag, e.g. '{tweets}:' (default: none)",
    )
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        default=".transactional",
        help="local state: SQLite store, sample input, Delta tables (default: %(default)s)",
    )
    p.add_argument("--top", type=int, default=10, metavar="N", help="rows to print per table")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m examples.tweets",
        description="Exactly-once hashtag, user and pair counts over a stream of tweets.",
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logs (-v info, -vv debug)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = commands.add_parser("generate", help="write synthetic tweets as JSON Lines")
    gen.add_argument("--count", type=int, required=True, metavar="N", help="lines to write")
    gen.add_argument("--seed", type=int, default=42, metavar="S", help="same seed, same bytes")
    gen.add_argument(
        "--out", required=True, metavar="PATH", help="a file, or with --partitions a directory"
    )
    gen.add_argument(
        "--partitions",
        type=_positive,
        metavar="P",
        help="write P files part-00000.jsonl ... into the directory PATH",
    )
    gen.add_argument(
        "--bad-rate",
        type=_rate,
        default=0.0,
        metavar="R",
        help="fraction of bad lines, for the dead letters (default: 0)",
    )

    load = commands.add_parser(
        "load", help="put JSON Lines files into Redis queues or a Kafka topic"
    )
    load.add_argument("--input", required=True, metavar="PATH", help="a file or a directory")
    into = load.add_mutually_exclusive_group(required=True)
    into.add_argument("--redis-url", metavar="URL", help="into Redis queues")
    into.add_argument(
        "--kafka", metavar="HOSTS", help="into a Kafka topic (bootstrap servers, host:port,...)"
    )
    load.add_argument("--prefix", default="tweets", help="queue key prefix (default: tweets)")
    load.add_argument("--topic", default="tweets", help="Kafka topic (default: tweets)")
    load.add_argument(
        "--append",
        action="store_true",
        help="add the lines to queues that already hold messages (else refused: the input "
        "would be counted twice)",
    )

    run = commands.add_parser(
        "run",
        help="run the topology",
        description="Run the tweet topology; a rerun resumes exactly.",
    )
    run.add_argument("--source", choices=("file", "redis", "kafka"), default="file")
    run.add_argument(
        "--input",
        metavar="PATH",
        help="JSON Lines file or directory, local or s3://bucket/dir (default: a generated sample)",
    )
    run.add_argument(
        "--spout",
        choices=("transactional", "partitioned", "opaque"),
        default="partitioned",
        help="spout kind (default: %(default)s)",
    )
    run.add_argument("--prefix", default="tweets", help="Redis queue prefix, as given to load")
    run.add_argument("--kafka", metavar="HOSTS", help="Kafka bootstrap servers, for --source kafka")
    run.add_argument("--topic", default="tweets", help="Kafka topic, as given to load")
    run.add_argument(
        "--zookeeper",
        metavar="HOSTS",
        help="ZooKeeper state store, e.g. 127.0.0.1:2181 (default: SQLite)",
    )
    run.add_argument(
        "--zk-session-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="ZooKeeper session timeout: how long a standby waits for a dead leader "
        "before taking over (default: %(default)s)",
    )
    _add_sink_flags(run)
    run.add_argument("--master", default="local[*]", help="Spark master (default: %(default)s)")
    run.add_argument(
        "--remote",
        default=os.environ.get("TRANSACTIONAL_REMOTE"),
        metavar="URL",
        help="a Spark Connect server to run on (sc://host:port) instead of a Spark driver in "
        "this process; default: $TRANSACTIONAL_REMOTE, else none",
    )
    run.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting (spark.*), e.g. spark.pyspark.python=/path/to/python on a "
        "cluster; repeatable",
    )
    run.add_argument(
        "--batch-size",
        type=_batch_size,
        default=1000,
        metavar="N|auto",
        help="records per txid (per partition for partitioned/opaque); 'auto' starts at "
        "1000 and adapts to keep a txid under --target-latency",
    )
    run.add_argument(
        "--target-latency",
        type=float,
        default=10.0,
        metavar="S",
        help="with --batch-size auto: seconds one txid may take end to end (default: %(default)s)",
    )
    run.add_argument(
        "--topology-id",
        default="tweets",
        metavar="ID",
        help="the topology's state namespace (default: %(default)s)",
    )
    # The runner's own settings: the same flags as `transactional run`'s, from one table.
    add_flags(run, RUNNER_ONLY)
    run.add_argument(
        "--until-drained",
        action="store_true",
        help="stop when the input has no more data, instead of waiting for more",
    )
    run.add_argument(
        "--record-ids",
        action="store_true",
        help="also count each tweet under its id (table tweet_ids), so that a checker "
        "can tell every tweet lost or counted twice",
    )
    run.add_argument(
        "--fail-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="inject failures into this fraction of attempts",
    )
    run.add_argument("--fail-seed", type=int, metavar="S", help="seed of the injected failures")
    run.add_argument(
        "--crash-at",
        default=os.environ.get("TRANSACTIONAL_CRASH_AT") or None,
        metavar="POINT:TXID[,...]",
        help="SIGKILL the whole process when txid TXID reaches protocol step POINT "
        f"({', '.join(p.value for p in FaultPoint)}), for crash tests "
        "(env TRANSACTIONAL_CRASH_AT)",
    )

    show = commands.add_parser("show", help="print the top counts from the sink")
    _add_sink_flags(show)
    return parser


def _generate(args: argparse.Namespace, out: TextIO) -> None:
    from examples.tweets.generate import generate

    paths = generate(args.out, args.count, args.seed, args.partitions, args.bad_rate)
    print(kv("generated", lines=args.count, files=len(paths), out=args.out), file=out)


def _load(args: argparse.Namespace, out: TextIO) -> None:
    from examples.tweets.commands import check_redis
    from examples.tweets.load import load
    from examples.tweets.load_kafka import load_kafka

    if not Path(args.input).exists():
        raise ConfigurationError(f"--input {args.input} does not exist: pass a file or directory")
    if args.kafka:
        sent = load_kafka(args.input, args.kafka, args.topic, append=args.append)
        for partition, lines in sent.items():
            print(kv("loaded", topic=args.topic, partition=partition, lines=lines), file=out)
        return
    check_redis(args.redis_url)
    loaded = load(args.input, args.redis_url, args.prefix, append=args.append)
    for partition, lines in loaded.items():
        print(kv("loaded", queue=f"{args.prefix}:{partition}", lines=lines), file=out)


def _run(args: argparse.Namespace, out: TextIO) -> None:
    from examples.tweets.commands import RunOptions, run
    from transactional.cli.settings import given_flags, zookeeper_auth

    runner = given_flags(args, RUNNER_ONLY)
    options = {k: v for k, v in vars(args).items() if k not in ("command", "verbose", *runner)}
    run(RunOptions(**options, runner=runner, zookeeper_auth=zookeeper_auth()), out)


def _show(args: argparse.Namespace, out: TextIO) -> None:
    from examples.tweets.commands import show

    if args.sink == "redis" and args.delta_path:
        raise ConfigurationError("--delta-path is for --sink delta; drop it or use --sink delta")
    show(
        args.sink, args.top, args.state_dir, args.delta_path, args.redis_url, out,
        redis_key_prefix=args.redis_key_prefix,
    )  # fmt: skip


COMMANDS = {"generate": _generate, "load": _load, "run": _run, "show": _show}


def _batch_size(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', not {value!r}") from None


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)  # exits 2 on bad usage
    configure_logging(args.verbose)
    out = out or sys.stdout
    try:
        COMMANDS[args.command](args, out)
    except (ConfigurationError, StoreUnavailableError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TransactionalError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; run again to resume", file=sys.stderr)
        return 130
    return 0
