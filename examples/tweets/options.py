"""The demo's ``run`` options and their checks: everything that can be checked without
starting Spark is (flags, paths, Redis and ZooKeeper reachability, the runner's config),
so a bad configuration fails within a second with a message naming the flag to change,
not after a JVM start."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transactional.errors import ConfigurationError
from transactional.secrets import redact_url
from transactional.types import CommitMode

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
    #: ZooKeeper digest credentials (``user:password``), from TRANSACTIONAL_ZOOKEEPER_AUTH.
    zookeeper_auth: str | None = None
    state_dir: str = ".transactional"
    sink: str = "delta"
    delta_path: str | None = None
    redis_url: str | None = None
    redis_key_prefix: str = ""
    #: Also count each tweet under its id (table ``tweet_ids``), for per-record checks.
    record_ids: bool = False
    prefix: str = "tweets"
    kafka: str | None = None
    topic: str = "tweets"
    batch_size: int | str = 1000  # or "auto": adaptive, see transactional.flow
    target_latency: float = 10.0
    #: The runner's settings given as flags (``transactional.cli.settings.SETTINGS``, the
    #: same flags as ``transactional run``'s), by name; the rest are RunnerConfig's.
    runner: Mapping[str, Any] = field(default_factory=dict)
    topology_id: str = "tweets"
    until_drained: bool = False
    fail_rate: float = 0.0
    fail_seed: int | None = None
    crash_at: str | None = None
    master: str = "local[*]"
    #: A Spark Connect server (``sc://host:port``); None: a classic session on ``master``.
    remote: str | None = None
    #: ``--conf KEY=VALUE`` items: Spark settings, over the session's defaults.
    conf: tuple[str, ...] | list[str] = ()
    top: int = 10

    @property
    def spark_settings(self) -> dict[str, str]:
        """``conf`` as Spark settings (``transactional.cli.settings.parse_conf``); a runner
        setting is refused: the demo has its own flags for those."""
        from transactional.cli.settings import parse_conf

        parsed = parse_conf(list(self.conf))
        if parsed["runner"]:
            raise ConfigurationError(
                f"--conf {sorted(parsed['runner'])}: the demo takes Spark settings "
                "(spark.KEY=VALUE) here; use its own flags for runner settings"
            )
        return dict(parsed["spark"])

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
        """The Delta tables' directory or bucket URL (``committers.delta.table_root``: a
        local path made absolute, an ``s3://`` URL as given, any other URL refused)."""
        from committers.delta import table_root

        return table_root(self.delta_path or str(Path(self.state_dir) / "delta"), "--delta-path")


def check_options(opts: RunOptions) -> None:
    """Refuse flag combinations that cannot work, saying which flag to change."""
    if opts.source == "redis" and not opts.redis_url:
        raise ConfigurationError("--source redis reads queues from Redis: add --redis-url URL")
    if opts.source == "redis" and opts.input:
        raise ConfigurationError(
            "--input is for --source file; to read a file through Redis, first run "
            "`python -m examples.tweets load --input PATH --redis-url URL`"
        )
    if opts.source == "kafka" and not opts.kafka:
        raise ConfigurationError("--source kafka reads a topic: add --kafka HOSTS (--topic NAME)")
    if opts.source == "kafka" and opts.spout == "transactional":
        raise ConfigurationError(
            "--source kafka reads a topic's partitions: use --spout partitioned (replays "
            "exact ranges) or --spout opaque (for topics whose retention may delete a range)"
        )
    if opts.source == "kafka" and opts.input:
        raise ConfigurationError(
            "--input is for --source file; to read a file through Kafka, first run "
            "`python -m examples.tweets load --input PATH --kafka HOSTS --topic NAME`"
        )
    if opts.kafka and opts.source != "kafka":
        raise ConfigurationError(f"--kafka is for --source kafka, not --source {opts.source}")
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
    """The runner's config: the topology id, and the runner settings' flags."""
    from transactional.cli.settings import flags_runner_config

    return flags_runner_config(opts.topology_id, opts.runner)


def fixed_batch_size(opts: RunOptions) -> int:
    """The spouts' own size: the flag's number, or the adaptive start under ``auto``."""
    return AUTO_INITIAL if opts.batch_size == "auto" else int(opts.batch_size)


def adaptive_batch_size(opts: RunOptions) -> Any:
    """``--batch-size auto``: TCP-like flow control of new txids' sizes (slow start, then
    AIMD; transactional.flow)."""
    if opts.batch_size != "auto":
        return None
    from transactional.flow import AdaptiveBatchSize, BatchSizeConfig

    return AdaptiveBatchSize(
        BatchSizeConfig(
            initial=AUTO_INITIAL,
            minimum=100,
            maximum=AUTO_MAXIMUM,
            target_latency_s=opts.target_latency,
        )
    )


def check_redis(url: str, flag: str = "--redis-url") -> None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except (redis.RedisError, ValueError) as e:
        raise ConfigurationError(
            f"cannot reach Redis at {redact_url(url)} ({e}): start redis-server there or fix {flag}"
        ) from None
    finally:
        client.close()


def check_zookeeper(hosts: str) -> None:
    """Fail at once when no server of ``hosts`` accepts a connection, instead of after
    Spark's start and the store's connect timeout."""
    from coordinators import ZooKeeperStateStore

    ZooKeeperStateStore(hosts).preflight()


def check_delta_path(path: str) -> None:
    """Refuse a ``--delta-path`` that cannot become a directory before anything starts
    (a local path only: a remote one is checked when the tables are opened)."""
    from transactional.preflight import check_writable_dir

    check_writable_dir(path, "--delta-path")
