"""The ``run`` and ``show`` commands: from checked options to a running topology, and
back from the sink to a table of top counts.

Everything that can be checked without starting Spark is checked first (flags, paths,
Redis reachability, the runner's config), so a bad configuration fails within a
second with a message naming the flag to change, not after a JVM start.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from examples.tweets import sources
from examples.tweets.generate import generate
from examples.tweets.inputs import redact
from examples.tweets.progress import ProgressListener, kv
from examples.tweets.sinks import TABLE_KEYS, Summary, make_committer, read_summary, spark_conf
from examples.tweets.topology import build_topology
from transactional.errors import ConfigurationError
from transactional.interrupt import stop_on_signals
from transactional.types import CommitMode

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from transactional.spout import AnySpout

log = logging.getLogger("examples.tweets")

#: The sample used when ``run`` gets no ``--input``: big enough to take a few dozen
#: txids at the default batch size, with a few bad lines for the dead letters.
SAMPLE = {"count": 20_000, "seed": 42, "partitions": 4, "bad_rate": 0.002}


#: ``--batch-size auto``: where the adaptive size starts and the most it may reach.
AUTO_INITIAL = 1_000
AUTO_MAXIMUM = 200_000


@dataclass(frozen=True)
class RunOptions:
    source: str = "file"
    input: str | None = None
    spout: str = "partitioned"
    zookeeper: str | None = None
    zk_session_timeout: float = 10.0
    state_dir: str = ".transactional"
    sink: str = "delta"
    delta_path: str | None = None
    redis_url: str | None = None
    prefix: str = "tweets"
    batch_size: int | str = 1000  # or "auto": adaptive, see transactional.flow
    target_latency: float = 10.0
    max_pending: int = 2
    max_attempts: int = 10
    topology_id: str = "tweets"
    until_drained: bool = False
    fail_rate: float = 0.0
    fail_seed: int | None = None
    crash_at: str | None = None
    master: str = "local[*]"
    top: int = 10

    @property
    def mode(self) -> CommitMode:
        """Only an opaque committer can undo a batch that a replay may change."""
        return CommitMode.OPAQUE if self.spout == "opaque" else CommitMode.TRANSACTIONAL

    @property
    def sinks(self) -> tuple[str, ...]:
        """``--sink both`` is Redis then Delta: two committers of one topology."""
        return ("redis", "delta") if self.sink == "both" else (self.sink,)

    @property
    def delta_dir(self) -> str:
        # Absolute: Delta reads a relative location as a table name.
        return str(Path(self.delta_path or Path(self.state_dir) / "delta").resolve())


def check_options(opts: RunOptions) -> None:
    """Refuse flag combinations that cannot work, saying which flag to change."""
    if opts.source == "redis" and not opts.redis_url:
        raise ConfigurationError("--source redis reads queues from Redis: add --redis-url URL")
    if opts.source == "redis" and opts.input:
        raise ConfigurationError(
            "--input is for --source file; to read a file through Redis, first run "
            "`python -m examples.tweets load --input PATH --redis-url URL`"
        )
    if "redis" in opts.sinks and not opts.redis_url:
        raise ConfigurationError(f"--sink {opts.sink} writes counts to Redis: add --redis-url URL")
    if opts.sink == "redis" and opts.delta_path:
        raise ConfigurationError("--delta-path is for --sink delta; drop it or use --sink delta")
    if opts.batch_size != "auto" and int(opts.batch_size) < 1:
        raise ConfigurationError(
            f"--batch-size must be at least 1 or 'auto', not {opts.batch_size}"
        )
    if opts.target_latency <= 0:
        raise ConfigurationError(f"--target-latency must be positive, not {opts.target_latency}")
    if not 0.0 <= opts.fail_rate < 1.0:
        raise ConfigurationError(f"--fail-rate must be in [0, 1), not {opts.fail_rate}")
    if opts.fail_seed is not None and not opts.fail_rate:
        raise ConfigurationError("--fail-seed only applies with --fail-rate P (P > 0)")
    if opts.top < 0:
        raise ConfigurationError(f"--top must be 0 or more, not {opts.top}")
    if opts.crash_at:
        crash_plan(opts.crash_at)
    if not opts.zk_session_timeout > 0:
        raise ConfigurationError(
            "--zk-session-timeout must be a positive number of seconds, "
            f"not {opts.zk_session_timeout}"
        )


def crash_plan(spec: str) -> Any:
    """The ``--crash-at`` plan, or a ``ConfigurationError`` naming the flag."""
    from transactional.faults import KillAt

    try:
        return KillAt.parse(spec)
    except ConfigurationError as e:
        raise ConfigurationError(f"--crash-at (or TRANSACTIONAL_CRASH_AT): {e}") from None


def runner_config(opts: RunOptions) -> Any:
    from pydantic import ValidationError

    from transactional.config import RunnerConfig

    try:
        return RunnerConfig(
            topology_id=opts.topology_id,
            max_pending=opts.max_pending,
            max_attempts=opts.max_attempts,
        )
    except ValidationError as e:
        flags = {
            "topology_id": "--topology-id",
            "max_pending": "--max-pending",
            "max_attempts": "--max-attempts",
        }
        problems = "; ".join(
            f"{flags.get(str(err['loc'][0]), err['loc'][0])}: {err['msg']}" for err in e.errors()
        )
        raise ConfigurationError(f"bad runner configuration: {problems}") from None


def check_redis(url: str, flag: str = "--redis-url") -> None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except (redis.RedisError, ValueError) as e:
        raise ConfigurationError(
            f"cannot reach Redis at {redact(url)} ({e}): start redis-server there or fix {flag}"
        ) from None
    finally:
        client.close()


def check_zookeeper(hosts: str) -> None:
    """Fail at once when no server of ``hosts`` accepts a connection, instead of after
    Spark's start and the store's connect timeout."""
    import socket

    from kazoo.hosts import collect_hosts

    try:
        servers, _chroot = collect_hosts(hosts)
    except ValueError as e:
        raise ConfigurationError(
            f"--zookeeper {hosts!r} is not host:port[,host:port...][/chroot]: {e}"
        ) from None
    problems = []
    for host, port in servers:
        try:
            socket.create_connection((host, port), timeout=3).close()
            return
        except OSError as e:
            problems.append(f"{host}:{port}: {e.strerror or e}")
    raise ConfigurationError(
        f"cannot reach ZooKeeper at {hosts} ({'; '.join(problems) or 'no servers given'}): "
        "start the ZooKeeper servers there or fix --zookeeper"
    )


def check_delta_path(path: str) -> None:
    """Refuse a ``--delta-path`` that cannot become a directory before anything starts
    (a local path only: a remote one is checked when the tables are opened)."""
    if "://" in path:
        return
    target = existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigurationError(
            f"--delta-path {path} cannot be a directory: {existing} is a file; pass the "
            "path of a directory (it is created if missing)"
        )
    if existing != target and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigurationError(
            f"--delta-path {path} cannot be created: {existing} is not writable; pass a "
            "directory this user may write"
        )


def sample_input(state_dir: Path) -> Path:
    """The default input, generated once into the state directory (atomically, so an
    interrupted first run never leaves a half-written sample to be read later)."""
    target = state_dir / "sample"
    if not target.is_dir():
        staging = state_dir / f".sample-{os.getpid()}"
        generate(staging, **SAMPLE)  # type: ignore[arg-type]
        staging.rename(target)
        log.info(kv("sample_generated", path=target, **SAMPLE))
    return target


def make_spout(opts: RunOptions, input_path: Path | None) -> AnySpout:
    if opts.source == "redis":
        assert opts.redis_url is not None
        redis_kinds: dict[str, Callable[..., AnySpout]] = {
            "transactional": sources.RedisTransactionalSpout,
            "partitioned": sources.RedisPartitionedSpout,
            "opaque": sources.RedisOpaqueSpout,
        }
        return redis_kinds[opts.spout](opts.redis_url, opts.prefix, fixed_batch_size(opts))
    assert input_path is not None
    file_kinds: dict[str, Callable[..., AnySpout]] = {
        "transactional": sources.FileTransactionalSpout,
        "partitioned": sources.FilePartitionedSpout,
        "opaque": sources.FileOpaqueSpout,
    }
    return file_kinds[opts.spout](input_path, fixed_batch_size(opts))


def make_store(opts: RunOptions) -> Any:
    if opts.zookeeper:
        from coordinators import ZooKeeperStateStore

        return ZooKeeperStateStore(opts.zookeeper, session_timeout=opts.zk_session_timeout)
    from coordinators import SQLiteStateStore

    return SQLiteStateStore(Path(opts.state_dir) / "state.db")


def start_spark(master: str, sink: str, state_dir: Path) -> SparkSession:
    """One session for the run. Executors must run this interpreter (it has pyarrow and
    this project), and Spark's own logging is cut to warnings from the JVM's start."""
    from transactional.session import create_spark_session

    state_dir.mkdir(parents=True, exist_ok=True)
    conf = spark_conf(sink)
    return create_spark_session(master, "tweets", conf)


def fixed_batch_size(opts: RunOptions) -> int:
    """The spouts' own size: the flag's number, or the adaptive start under ``auto``."""
    return AUTO_INITIAL if opts.batch_size == "auto" else int(opts.batch_size)


def adaptive_batch_size(opts: RunOptions) -> Any:
    """``--batch-size auto``: AIMD flow control of new txids' sizes (transactional.flow)."""
    if opts.batch_size != "auto":
        return None
    from transactional.flow import AdaptiveBatchSize, BatchSizeConfig

    return AdaptiveBatchSize(
        BatchSizeConfig(
            initial=AUTO_INITIAL, minimum=100, maximum=AUTO_MAXIMUM,
            target_latency_s=opts.target_latency,
        )
    )  # fmt: skip


def run(opts: RunOptions, out: TextIO) -> None:
    """Run the topology; raises ``ConfigurationError`` for anything the user must fix."""
    check_options(opts)
    config = runner_config(opts)
    state_dir = Path(opts.state_dir)
    input_path: Path | None = None
    if opts.source == "file":
        input_path = Path(opts.input) if opts.input else sample_input(state_dir)
        if not input_path.exists():
            raise ConfigurationError(
                f"--input {input_path} does not exist: pass a JSON Lines file or directory, "
                "e.g. one made by `python -m examples.tweets generate --count N --out PATH`"
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
        name: make_committer(name, opts.mode, delta_path=opts.delta_dir, redis_url=opts.redis_url)
        for name in opts.sinks
    }
    # One sink keeps its committer name "sink"; two are named after their sinks.
    topology = build_topology(spout, committers if len(committers) > 1 else committers[opts.sink])
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
    spark = start_spark(opts.master, opts.sink, state_dir)
    try:
        with ProgressListener(out) as listener:
            runner = TransactionalRunner(
                topology, store, spark, config, faults=faults, listener=listener,
                batch_size=adaptive_batch_size(opts),
            )  # fmt: skip
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
            ),
            file=out,
        )
        for sink in opts.sinks if opts.top else ():
            summary = read_summary(
                sink, opts.top, delta_path=opts.delta_dir, redis_url=opts.redis_url,
                spark=spark, tables=("hashtags",),
            )  # fmt: skip
            print_summary(
                summary, out, dead_letters=False, sink=sink if opts.sink == "both" else ""
            )
    finally:
        if owns_session:
            spark.stop()


def show(sink: str, top: int, state_dir: str, delta_path: str | None, redis_url: str | None,
         master: str, out: TextIO) -> None:  # fmt: skip
    sinks = ("redis", "delta") if sink == "both" else (sink,)
    summaries: dict[str, Summary] = {}
    if "redis" in sinks:
        if not redis_url:
            raise ConfigurationError(f"--sink {sink} reads counts from Redis: add --redis-url URL")
        check_redis(redis_url)
        summaries["redis"] = read_summary("redis", top, redis_url=redis_url)
    if "delta" in sinks:
        path = str(Path(delta_path or Path(state_dir) / "delta").resolve())
        if not Path(path).is_dir():
            raise ConfigurationError(
                f"--delta-path {path} does not exist: nothing was committed there; run "
                "`python -m examples.tweets run` first, or pass the path it used"
            )
        from pyspark.sql import SparkSession

        owns_session = SparkSession.getActiveSession() is None  # embedded callers keep theirs
        spark = start_spark(master, "delta", Path(state_dir))
        try:
            summaries["delta"] = read_summary("delta", top, delta_path=path, spark=spark)
        finally:
            if owns_session:
                spark.stop()
    for name, summary in summaries.items():
        print_summary(summary, out, sink=name if len(sinks) > 1 else "")


def print_summary(summary: Summary, out: TextIO, dead_letters: bool = True, sink: str = "") -> None:
    """``sink``: a name to put before the titles, when several sinks are shown."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=out)
    if sink:
        console.print(Text(f"{sink}:", style="bold"))
    titles = {"hashtags": "top hashtags", "users": "top users", "users_hashtags": "top pairs"}
    for name, rows in summary.tops.items():
        table = Table(title=titles.get(name, name), title_justify="left")
        table.add_column(" / ".join(TABLE_KEYS.get(name, ("key",))))
        table.add_column("count", justify="right")
        for key, count in rows:
            # Text, not markup: a tag like "#[b]" must print as itself. Escapes make
            # invisible characters (a no-break space) visible.
            shown = key if key.isprintable() else repr(key)[1:-1]
            table.add_row(Text(shown), f"{count:,}")
        console.print(table)
    if dead_letters:
        console.print(f"dead letters: {summary.dead_letters:,}")
