"""The ``transactional`` command: run a user's topology, or look at a topology's state.

Settings come from flags, or from ``TRANSACTIONAL_*`` environment variables for the
same names (``TRANSACTIONAL_ZOOKEEPER``, ``TRANSACTIONAL_STATE_DIR``,
``TRANSACTIONAL_MASTER``, ``TRANSACTIONAL_CRASH_AT``); only this edge reads the environment.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from transactional.config import RunnerConfig
from transactional.errors import ConfigurationError, TransactionalError
from transactional.faults import FaultPoint, KillAt
from transactional.store import StateStore


def open_store(zookeeper: str | None, state_dir: str) -> StateStore:
    """The ZooKeeper store if hosts are given, else the embedded SQLite store."""
    name = "zookeeper" if zookeeper else "sqlite"
    found = {ep.name: ep for ep in entry_points(group="transactional.stores")}
    if name not in found:
        raise ConfigurationError(
            f"no state store named {name!r} is installed; install the project with "
            "`pip install -e .` so its entry points are registered"
        )
    store_cls = found[name].load()
    if zookeeper:
        return store_cls(zookeeper)  # type: ignore[no-any-return]
    return store_cls(Path(state_dir) / "state.db")  # type: ignore[no-any-return]


def configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
        stream=sys.stderr,
    )


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"TRANSACTIONAL_{name}", default)


def _add_store_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topology-id", required=True)
    parser.add_argument("--zookeeper", default=_env("ZOOKEEPER"), help="ZooKeeper hosts")
    parser.add_argument(
        "--state-dir",
        default=_env("STATE_DIR", ".transactional"),
        help="directory of the embedded SQLite store (when no --zookeeper)",
    )


def _load_factory(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise ConfigurationError(f"{spec!r}: give the topology factory as module:function")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load topology factory {spec!r}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="transactional", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0)
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser(
        "run", help="run a topology: FACTORY is module:function(spark) -> Topology"
    )
    run.add_argument("factory")
    _add_store_flags(run)
    run.add_argument("--master", default=_env("MASTER", "local[*]"), help="Spark master URL")
    run.add_argument("--max-pending", type=int, default=2)
    run.add_argument("--max-attempts", type=int, default=10)
    run.add_argument("--until-drained", action="store_true")
    run.add_argument(
        "--crash-at",
        default=_env("CRASH_AT"),
        metavar="POINT:TXID[,...]",
        help="SIGKILL the process (and its Spark JVM) when txid TXID reaches step POINT "
        f"({', '.join(p.value for p in FaultPoint)}); for crash tests",
    )

    status = commands.add_parser("status", help="print currtx and the stored transactions")
    _add_store_flags(status)

    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    try:
        if args.command == "status":
            return _status(args)
        return _run(args)
    except TransactionalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _status(args: argparse.Namespace) -> int:
    store = open_store(args.zookeeper, args.state_dir)
    store.open(args.topology_id)
    try:
        state = store.read_state()
    finally:
        store.close()
    print(f"topology {args.topology_id}: currtx={state.currtx}")
    for txid in sorted(state.metas):
        status = "committed" if txid < state.currtx else "started"
        print(f"  txid {txid} ({status}): {state.metas[txid]}")
        for p, meta in sorted(state.partitions.get(txid, {}).items()):
            print(f"    partition {p}: {meta}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from transactional.runner import TransactionalRunner
    from transactional.session import create_spark_session

    crash = KillAt.parse(args.crash_at) if args.crash_at else None
    factory = _load_factory(args.factory)
    config = RunnerConfig(
        topology_id=args.topology_id, max_pending=args.max_pending, max_attempts=args.max_attempts
    )
    store = open_store(args.zookeeper, args.state_dir)
    spark = create_spark_session(args.master, f"transactional-{args.topology_id}")
    topology = factory(spark)
    stats = TransactionalRunner(topology, store, spark, config, faults=crash).run(
        until_drained=args.until_drained
    )
    print(
        f"committed {stats.committed_txids} txids, {stats.records} records, {stats.failures} failures"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
