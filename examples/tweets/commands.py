"""The ``run`` and ``show`` commands: from checked options (``options``) through the
parts of a run (``wiring``) to a running topology, and back from the sink to a table
of top counts (``output``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TextIO

from committers.delta import table_root
from examples.tweets.options import (
    RunOptions,
    adaptive_batch_size,
    check_delta_path,
    check_options,
    check_redis,
    check_zookeeper,
    crash_plan,
    runner_config,
)
from examples.tweets.output import print_summary
from examples.tweets.progress import ProgressListener, kv
from examples.tweets.sinks import Summary, make_committer, read_summary
from examples.tweets.topology import build_topology
from examples.tweets.wiring import make_spout, make_store, sample_input, start_spark
from transactional.cli.interrupt import stop_on_signals
from transactional.errors import ConfigurationError
from transactional.guarantees import check_guarantee
from transactional.session import stop_spark_session
from transactional.spark.storage import is_local

__all__ = ["RunOptions", "check_redis", "make_committer", "run", "show"]

log = logging.getLogger("examples.tweets")


def run(opts: RunOptions, out: TextIO) -> None:
    """Run the topology; raises ``ConfigurationError`` for anything the user must fix."""
    check_options(opts)
    config = runner_config(opts)
    state_dir = Path(opts.state_dir)
    input_path: str | None = None
    if opts.source == "file":
        input_path = opts.input or str(sample_input(state_dir))
        # A local input is checked here; one in a bucket (s3://bucket/dir) by the source.
        if is_local(input_path) and not Path(input_path).exists():
            raise ConfigurationError(
                f"--input {input_path} does not exist: pass a JSON Lines file or directory "
                "(or an S3 URL of one), e.g. one made by "
                "`python -m examples.tweets generate --count N --out PATH`"
            )
    for url in {opts.redis_url} if "redis" in (opts.source, *opts.sinks) else set():
        check_redis(url)  # type: ignore[arg-type]
    if opts.zookeeper:
        check_zookeeper(opts.zookeeper)
    if "delta" in opts.sinks:
        check_delta_path(opts.delta_dir)

    from transactional.faults import RandomFaults, combine
    from transactional.runner import TransactionalRunner

    spout = make_spout(opts, input_path)
    committers = {
        name: make_committer(
            name,
            opts.mode,
            delta_path=opts.delta_dir,
            redis_url=opts.redis_url,
            redis_key_prefix=opts.redis_key_prefix,
            record_ids=opts.record_ids,
        )
        for name in opts.sinks
    }
    # One sink keeps its committer name "sink"; two are named after their sinks.
    topology = build_topology(
        spout,
        committers if len(committers) > 1 else committers[opts.sink],
        record_ids=opts.record_ids,
    )
    topology.preflight()  # Kafka's broker and topic; the sinks were checked above
    check_guarantee(topology, config.guarantee)
    store = make_store(opts)
    crash = crash_plan(opts.crash_at) if opts.crash_at else None
    faults = combine(
        RandomFaults(opts.fail_rate, opts.fail_seed or 0) if opts.fail_rate else None, crash
    )
    log.info(
        kv("run_start", source=opts.source, spout=opts.spout, sink=opts.sink, input=input_path)
    )
    from pyspark.sql import SparkSession

    owns_session = SparkSession.getActiveSession() is None  # embedded callers keep theirs
    spark = start_spark(
        opts.master,
        opts.sink,
        state_dir,
        spout,
        opts.spark_settings,
        opts.delta_dir,
        remote=opts.remote,
    )
    try:
        with ProgressListener(out, lag=spout.lag, guarantee=config.guarantee) as listener:
            runner = TransactionalRunner(
                topology,
                store,
                spark,
                config,
                faults=faults,
                listener=listener,
                batch_size=adaptive_batch_size(opts),
            )
            # Ctrl-C or SIGTERM: finish the step, abandon what is in flight (it replays).
            with stop_on_signals(runner.stop) as interrupted:
                stats = runner.run(until_drained=opts.until_drained)
            if interrupted.signal is not None:
                raise KeyboardInterrupt
        if crash is not None and crash.pending:
            targets = ",".join(f"{p.value}:{t}" for p, t in crash.pending)
            log.warning(kv("crash_not_reached", targets=targets, hint="txid committed before?"))
        print(
            kv(
                "run_done",
                committed_txids=stats.committed_txids,
                records=stats.records,
                failures=stats.failures,
                guarantee=config.guarantee,
                **(
                    {"dropped_txids": stats.dropped_txids, "dropped_records": stats.dropped_records}
                    if stats.dropped_txids
                    else {}
                ),
            ),
            file=out,
        )
        for sink in opts.sinks if opts.top else ():
            summary = read_summary(
                sink,
                opts.top,
                delta_path=opts.delta_dir,
                redis_url=opts.redis_url,
                redis_key_prefix=opts.redis_key_prefix,
                tables=("hashtags",),
            )
            print_summary(
                summary, out, dead_letters=False, sink=sink if opts.sink == "both" else ""
            )
    finally:
        if owns_session:
            stop_spark_session(spark)


def show(
    sink: str,
    top: int,
    state_dir: str,
    delta_path: str | None,
    redis_url: str | None,
    out: TextIO,
    redis_key_prefix: str = "",
) -> None:
    """Print the top counts; reads the sinks directly (Delta with delta-rs): no Spark."""
    sinks = ("redis", "delta") if sink == "both" else (sink,)
    summaries: dict[str, Summary] = {}
    if "redis" in sinks:
        if not redis_url:
            raise ConfigurationError(f"--sink {sink} reads counts from Redis: add --redis-url URL")
        check_redis(redis_url)
        summaries["redis"] = read_summary(
            "redis", top, redis_url=redis_url, redis_key_prefix=redis_key_prefix
        )
    if "delta" in sinks:
        path = table_root(delta_path or str(Path(state_dir) / "delta"), "--delta-path")
        if "://" not in path and not Path(path).is_dir():
            raise ConfigurationError(
                f"--delta-path {path} does not exist: nothing was committed there; run "
                "`python -m examples.tweets run` first, or pass the path it used"
            )
        summaries["delta"] = read_summary("delta", top, delta_path=path)
    for name, summary in summaries.items():
        print_summary(summary, out, sink=name if len(sinks) > 1 else "")
