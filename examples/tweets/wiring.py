"""From checked options to the parts of a run: the input, the spout, the state store
and the Spark session."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from examples.tweets import sources
from examples.tweets.generate import generate
from examples.tweets.options import RunOptions, fixed_batch_size
from examples.tweets.progress import kv
from examples.tweets.sinks import spark_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from transactional.spout import AnySpout

log = logging.getLogger("examples.tweets")

#: The sample used when ``run`` gets no ``--input``: big enough to take a few dozen
#: txids at the default batch size, with a few bad lines for the dead letters.
SAMPLE = {"count": 20_000, "seed": 42, "partitions": 4, "bad_rate": 0.002}


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


def make_spout(opts: RunOptions, input_path: str | None) -> AnySpout:
    if opts.source == "redis":
        assert opts.redis_url is not None
        redis_kinds: dict[str, Callable[..., AnySpout]] = {
            "transactional": sources.RedisTransactionalSpout,
            "partitioned": sources.RedisPartitionedSpout,
            "opaque": sources.RedisOpaqueSpout,
        }
        return redis_kinds[opts.spout](opts.redis_url, opts.prefix, fixed_batch_size(opts))
    if opts.source == "kafka":
        from transactional.sources.kafka import KafkaOpaqueSpout, KafkaPartitionedSpout

        assert opts.kafka is not None
        kind = KafkaOpaqueSpout if opts.spout == "opaque" else KafkaPartitionedSpout
        return kind(opts.kafka, opts.topic, fixed_batch_size(opts))
    from transactional.sources import files

    assert input_path is not None
    file_kinds: dict[str, Callable[..., AnySpout]] = {
        "transactional": files.FilesTransactionalSpout,
        "partitioned": files.FilesPartitionedSpout,
        "opaque": files.FilesOpaqueSpout,
    }
    return file_kinds[opts.spout](input_path, fixed_batch_size(opts))


def make_store(opts: RunOptions) -> Any:
    if opts.zookeeper:
        from coordinators import ZooKeeperStateStore

        return ZooKeeperStateStore(
            opts.zookeeper,
            session_timeout=opts.zk_session_timeout,
            credentials=opts.zookeeper_auth,
        )
    from coordinators import SQLiteStateStore

    return SQLiteStateStore(Path(opts.state_dir) / "state.db")


def start_spark(
    master: str,
    sink: str,
    state_dir: Path,
    spout: AnySpout | None = None,
    settings: Mapping[str, str] | None = None,
    delta_path: str | None = None,
    remote: str | None = None,
) -> SparkSession:
    """One session for the run, with what the sink and the spout need (Delta's and
    Kafka's jars) and the user's ``settings`` (``--conf``) over them; Spark's own
    logging is cut to warnings from the JVM's start."""
    from transactional.session import create_spark_session, merged

    state_dir.mkdir(parents=True, exist_ok=True)
    spout_conf = spout.spark_conf() if spout is not None else {}
    conf = merged(spark_conf(sink, delta_path), spout_conf, settings or {})
    return create_spark_session(master, "tweets", conf, remote=remote)
