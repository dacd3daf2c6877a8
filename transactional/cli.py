"""The ``transactional`` command's commands: run a topology, look at a topology's state
(its grammar and usage: ``transactional.cli_parser``). Settings come from a ``--config``
TOML file, ``TRANSACTIONAL_*`` variables and flags, each overriding the one before
(``transactional.settings``); only this edge reads the environment."""

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

from transactional.cli_parser import RUN_SWITCHES, build_parser
from transactional.errors import (
    ConfigurationError,
    PoisonBatchError,
    StoreUnavailableError,
    TransactionalError,
)
from transactional.factories import build_topology, load_factory, takes_spark
from transactional.faults import KillAt
from transactional.interrupt import INTERRUPTED, stop_on_signals
from transactional.progress import ProgressListener
from transactional.query_view import query, query_document, query_lines
from transactional.rewind_view import rewind
from transactional.session import merged
from transactional.settings import (
    RunSettings,
    environment,
    load_settings,
    parse_conf,
    zookeeper_auth,
)
from transactional.status_view import look, status_document, status_lines, watch
from transactional.store import open_store

log = logging.getLogger("transactional.cli")

DONE, FAILED, REFUSED = 0, 1, 2


def configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
        stream=sys.stderr,
    )


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


def _store_location(args: argparse.Namespace) -> tuple[str | None, str, str | None]:
    env = environment()
    zookeeper = args.zookeeper or env.get("TRANSACTIONAL_ZOOKEEPER")
    state_dir = args.state_dir or env.get("TRANSACTIONAL_STATE_DIR") or ".transactional"
    return zookeeper, state_dir, zookeeper_auth()


def _status(args: argparse.Namespace) -> int:
    """Read-only: writes nothing anywhere, for an unknown topology id least of all."""
    topology_id = _topology_id(args)
    where = _store_location(args)
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


def _topology_id(args: argparse.Namespace) -> str:
    topology_id = args.topology_id or environment().get("TRANSACTIONAL_TOPOLOGY_ID")
    if not topology_id:
        raise ConfigurationError("give --topology-id ID (`transactional list` shows the ids)")
    return str(topology_id)


def _query(args: argparse.Namespace) -> int:
    """Read-only, like ``status``."""
    table, keys, values = query(args.factory, args.state, args.keys, args.committer)
    if args.json:
        print(json.dumps(query_document(table, keys, values), sort_keys=True))
        return DONE
    for line in query_lines(table, keys, values):
        print(line)
    return DONE


def _rewind(args: argparse.Namespace) -> int:
    topology_id = _topology_id(args)
    for line in rewind(args.factory, topology_id, _store_location(args), args.to, args.crash_at):
        print(line)
    return DONE


def _list(args: argparse.Namespace) -> int:
    for topology_id in open_store(*_store_location(args)).topology_ids():
        print(topology_id)
    return DONE


def _settings(args: argparse.Namespace) -> RunSettings:
    conf = parse_conf(args.conf)
    flags: dict[str, Any] = {
        "topology_id": args.topology_id,
        "master": args.master,
        "zookeeper": args.zookeeper,
        "state_dir": args.state_dir,
        "batch_size": args.batch_size,
        "until_drained": args.until_drained,
        "crash_at": args.crash_at,
        "max_pending": args.max_pending,
        "max_group": args.max_group,
        "max_attempts": args.max_attempts,
        "attempt_timeout_s": args.attempt_timeout,
        "leader_timeout_s": args.leader_timeout,
        "poll_interval_s": args.poll_interval,
        "poll_max_s": args.poll_max,
        # An off switch not given leaves the setting to the file, environment and --conf.
        **{setting: None if getattr(args, setting) else False for setting, _ in RUN_SWITCHES},
    }
    return load_settings(args.config, environment(), flags, conf)


def _batch_size(settings: RunSettings) -> Any:
    if settings.batch_size == "auto":
        from transactional.flow import AdaptiveBatchSize

        return AdaptiveBatchSize()
    return settings.batch_size


def _run(args: argparse.Namespace) -> int:
    from transactional.runner import TransactionalRunner
    from transactional.session import create_spark_session

    settings = _settings(args)
    config = settings.runner_config()
    crash = KillAt.parse(settings.crash_at) if settings.crash_at else None
    with _sigterm_as_ctrl_c():  # nothing started yet: a signal leaves at once
        factory = load_factory(args.factory)
        app = f"transactional-{settings.topology_id}"
        if takes_spark(factory, args.factory):
            spark = create_spark_session(
                settings.master, app, {**_installed_spark_conf(), **settings.spark}
            )
            topology = build_topology(factory, args.factory, spark)
        else:
            topology = build_topology(factory, args.factory)
            needed = merged(
                topology.spout.spark_conf(),
                *(n.committer.spark_conf() for n in topology.committers),
            )
            spark = create_spark_session(settings.master, app, {**needed, **settings.spark})
        store = open_store(settings.zookeeper, settings.state_dir, zookeeper_auth())
        # A live line on a terminal; otherwise a heartbeat in the logs (-v shows it).
        progress = ProgressListener(
            sys.stderr,
            lag=topology.spout.lag,
            line=lambda text: logging.getLogger("transactional.progress").info(text),
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
        print(
            f"interrupted ({interrupted.name}): committed {stats.committed_txids} txids "
            f"(last {stats.last_committed or 'none'}); txids in flight were abandoned and "
            "replay on the next run",
            file=sys.stderr,
        )
        return INTERRUPTED
    print(
        f"committed {stats.committed_txids} txids, {stats.records} records, {stats.failures} failures"
    )
    return DONE


if __name__ == "__main__":
    sys.exit(main())
