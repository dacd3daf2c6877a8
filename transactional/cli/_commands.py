"""The commands of ``transactional`` (the package's docstring says what they are)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from importlib.metadata import entry_points
from types import FrameType
from typing import Any

from transactional.cli._factories import build_topology, load_factory, takes_spark
from transactional.cli._parser import build_parser
from transactional.cli._query import query, query_json, query_lines
from transactional.cli._rewind import rewind
from transactional.cli._status import look, status_document, status_lines, watch
from transactional.cli.interrupt import INTERRUPTED, stop_on_signals
from transactional.cli.logs import configure_logging, quiet_spark_errors
from transactional.cli.progress import ProgressListener
from transactional.cli.settings import (
    RunSettings,
    StoreSettings,
    environment,
    given_flags,
    load_settings,
    load_store_settings,
    parse_conf,
    zookeeper_auth,
)
from transactional.errors import (
    ConfigurationError,
    PoisonBatchError,
    StoreUnavailableError,
    TransactionalError,
)
from transactional.faults import KillAt
from transactional.guarantees import check_guarantee
from transactional.spark.session import merged
from transactional.store import StateStore, open_store
from transactional.types import Guarantee

log = logging.getLogger("transactional.cli")

DONE, FAILED, REFUSED = 0, 1, 2


def _installed_spark_conf() -> dict[str, str]:
    """What every installed committer package asks of a session (Delta's jars and
    extensions), for a factory that needs the session before its committers exist."""
    return merged(*(ep.load()() for ep in entry_points(group="transactional.spark_conf")))


class _Standby(BaseException):
    """Raised by the signal handler in a runner that is not leading (yet)."""


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """Until the run's own handlers are in place, SIGTERM is Ctrl-C (a KeyboardInterrupt,
    as PySpark's SIGINT handler raises once a session exists): nothing has started, so
    the command leaves at once with one line and exit 130, not killed by the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # exits 2 on bad usage
    configure_logging(args.verbose)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "status":
            return _status(args)
        if args.command == "query":
            return _query(args)
        if args.command == "rewind":
            return _rewind(args)
        return _list(args)
    except KeyboardInterrupt:  # before the run's own handlers are in place
        print("interrupted before the run started; nothing was committed", file=sys.stderr)
        return INTERRUPTED
    except PoisonBatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return FAILED
    except (ConfigurationError, StoreUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return REFUSED
    except TransactionalError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return FAILED


def _store_settings(args: argparse.Namespace) -> StoreSettings:
    return load_store_settings(
        args.config, environment(), given_flags(args, args.command), args.command
    )


def _store(settings: StoreSettings) -> StateStore:
    """The store, checked to be reachable (``StateStore.preflight``)."""
    store = open_store(*_store_location(settings))
    store.preflight()
    return store


def _store_location(settings: StoreSettings) -> tuple[str | None, str, str | None, float]:
    return (
        settings.zookeeper,
        settings.state_dir,
        zookeeper_auth(),
        settings.zk_session_timeout,
    )


def _status(args: argparse.Namespace) -> int:
    """Read-only: writes nothing anywhere, for an unknown topology id least of all."""
    settings = _store_settings(args)
    topology_id = _topology_id(settings)
    where = _store_location(settings)
    _store(settings)  # reachable: else one line now, not after a connect timeout
    if args.watch:
        watch(where, topology_id, args.factory, args.interval)
        return DONE
    state, report, sinks = look(where, topology_id, args.factory)
    if args.json:
        print(json.dumps(status_document(topology_id, state, report, sinks), sort_keys=True))
        return DONE
    for line in status_lines(topology_id, state, report, sinks):
        print(line)
    return DONE


def _topology_id(settings: StoreSettings) -> str:
    if not settings.topology_id:
        raise ConfigurationError("give --topology-id ID (`transactional list` shows the ids)")
    return settings.topology_id


def _query(args: argparse.Namespace) -> int:
    """Read-only, like ``status``."""
    table, keys, values = query(args.factory, args.state, args.keys, args.committer)
    if args.json:
        print(query_json(table, keys, values))
        return DONE
    for line in query_lines(table, keys, values):
        print(line)
    return DONE


def _rewind(args: argparse.Namespace) -> int:
    settings = _store_settings(args)
    topology_id = _topology_id(settings)
    where = _store_location(settings)
    _store(settings)
    for line in rewind(args.factory, topology_id, where, args.to, args.crash_at):
        print(line)
    return DONE


def _list(args: argparse.Namespace) -> int:
    for topology_id in _store(_store_settings(args)).topology_ids():
        print(topology_id)
    return DONE


def _settings(args: argparse.Namespace) -> RunSettings:
    flags = given_flags(args, "run")
    return load_settings(args.config, environment(), flags, parse_conf(args.conf))


def _batch_size(settings: RunSettings) -> Any:
    if settings.batch_size == "auto":
        from transactional.flow import AdaptiveBatchSize, BatchSizeConfig

        latency = settings.target_latency_s
        return AdaptiveBatchSize(
            BatchSizeConfig() if latency is None else BatchSizeConfig(target_latency_s=latency)
        )
    return settings.batch_size


def _run(args: argparse.Namespace) -> int:
    from transactional.runner import TransactionalRunner
    from transactional.spark.session import create_spark_session

    settings = _settings(args)
    config = settings.runner_config()
    crash = KillAt.parse(settings.crash_at) if settings.crash_at else None
    with _sigterm_as_ctrl_c():  # nothing started yet: a signal leaves at once
        factory = load_factory(args.factory)
        app = f"transactional-{settings.topology_id}"
        # Everything that can be checked without Spark is, before its JVM starts: an
        # unreachable store or sink is one line within seconds.
        store = _store(settings)
        quiet_spark_errors(args.verbose)
        if takes_spark(factory, args.factory):
            spark = create_spark_session(
                settings.master,
                app,
                {**_installed_spark_conf(), **settings.spark},
                remote=settings.remote,
            )
            topology = build_topology(factory, args.factory, spark)
            topology.preflight()
            check_guarantee(topology, config.guarantee)
        else:
            topology = build_topology(factory, args.factory)
            topology.preflight()
            check_guarantee(topology, config.guarantee)
            needed = merged(
                topology.spout.spark_conf(),
                *(n.committer.spark_conf() for n in topology.committers),
            )
            spark = create_spark_session(
                settings.master, app, {**needed, **settings.spark}, remote=settings.remote
            )
        # A live line on a terminal; otherwise a heartbeat in the logs (-v shows it).
        progress = ProgressListener(
            sys.stderr,
            lag=topology.spout.lag,
            line=lambda text: logging.getLogger("transactional.cli.progress").info(text),
            guarantee=config.guarantee,
        )
        runner = TransactionalRunner(
            topology,
            store,
            spark,
            config,
            faults=crash,
            batch_size=_batch_size(settings),
            listener=progress,
        )

    def leave_if_standby() -> None:
        # A runner that holds no leadership (a standby waiting for it, possibly forever)
        # has started nothing: it leaves at once instead of at the second signal. It is
        # a BaseException, so it passes stop_on_signals and the runner's cleanup.
        if store.fence_token() is None and runner.stats.committed_txids == 0:
            raise _Standby

    try:
        with stop_on_signals(runner.stop, leave_if_standby) as interrupted, progress:
            stats = runner.run(until_drained=settings.until_drained)
    except _Standby:
        print(
            f"interrupted ({interrupted.name}) while waiting for the leadership of topology "
            f"{settings.topology_id}: this runner started and committed nothing",
            file=sys.stderr,
        )
        return INTERRUPTED
    if interrupted.signal is not None:
        then = (
            "the next run drops them (at_most_once: never replayed)"
            if config.guarantee is Guarantee.AT_MOST_ONCE
            else "replay on the next run"
        )
        print(
            f"interrupted ({interrupted.name}): committed {stats.committed_txids} txids "
            f"(last {stats.last_committed or 'none'}); txids in flight were abandoned and "
            f"{then}",
            file=sys.stderr,
        )
        return INTERRUPTED
    dropped = (
        f", dropped {stats.dropped_txids} txids ({stats.dropped_records} records counted)"
        if stats.dropped_txids
        else ""
    )
    weaker = "" if config.guarantee is Guarantee.EXACTLY_ONCE else f" ({config.guarantee})"
    print(
        f"committed {stats.committed_txids} txids, {stats.records} records, "
        f"{stats.failures} failures{dropped}{weaker}"
    )
    return DONE
