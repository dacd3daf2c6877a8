"""The ``transactional`` command: run any topology, look at a topology's state.

    transactional run MODULE:FACTORY --topology-id ID [options]
    transactional status --topology-id ID [--state-dir DIR | --zookeeper HOSTS]
    transactional query MODULE:FACTORY STATE KEY... [--committer NAME] [--json]
    transactional rewind MODULE:FACTORY --topology-id ID --to TXID [store flags]
    transactional list [--state-dir DIR | --zookeeper HOSTS]

Exit codes: 0 done; 1 a batch failed ``--max-attempts`` times (or leadership was lost
to another runner, or the store failed mid-run): the state is kept, fix the cause and
run again to resume; 2 bad configuration or a broken contract, before anything of the
failing txid is committed; 130 interrupted (Ctrl-C or SIGTERM), in-flight txids replay
on the next run.

Settings come from a ``--config`` TOML file, ``TRANSACTIONAL_*`` variables and flags,
each overriding the one before (``transactional.settings``); only this edge reads the
environment.
"""

from __future__ import annotations

import argparse
from typing import Any

from transactional.faults import FaultPoint
from transactional.rewind_view import CRASH_POINTS
from transactional.settings import FLAGS


def _add_verbose(parser: argparse.ArgumentParser, default: Any = argparse.SUPPRESS) -> None:
    """``-v`` before or after the command (``transactional run ... -v``)."""
    parser.add_argument(
        "-v", "--verbose", action="count", default=default, help="log INFO (-vv: DEBUG)"
    )


def _add_store_flags(parser: argparse.ArgumentParser) -> None:
    _add_verbose(parser)
    parser.add_argument("--zookeeper", metavar="HOSTS", help="ZooKeeper hosts (else SQLite)")
    parser.add_argument(
        "--state-dir", metavar="DIR", help="directory of the embedded SQLite store (.transactional)"
    )


#: The runner's settings as flags: (flag, metavar, help).
_RUN_SETTINGS = (
    ("--batch-size", "N|auto", "records per new txid, or auto"),
    ("--max-pending", "K", "txids in flight (default 2)"),
    ("--max-group", "K", "processed txids committed as one sink write, at most (default 8)"),
    ("--max-attempts", "N", "failures of a txid before exit 1"),
    (
        "--attempt-timeout",
        "S|none",
        "seconds an attempt may process, and again commit (default 300; none: no limit)",
    ),
    (
        "--leader-timeout",
        "S|none",
        "seconds to wait for leadership, and to get it back (default none: no limit)",
    ),
    ("--poll-interval", "S", "idle poll interval (default 1)"),
    ("--poll-max", "S", "idle poll back-off limit (default 30)"),
    ("--status-interval", "S", "seconds between status reports to the store (default 2; 0: none)"),
    ("--metrics-port", "N", "serve Prometheus metrics on this port while the run lasts"),
    ("--metrics-host", "HOST", "address of the metrics server (default 127.0.0.1)"),
    (
        "--start-from",
        "POS",
        "where a new topology starts in its source: earliest, latest, an ISO time, a "
        "version, or KEY=OFFSET,...",
    ),
)
#: Runner settings that are on by default, as flags that turn them off: (setting, help);
#: the flag is ``settings.FLAGS[setting]``.
RUN_SWITCHES = (
    ("check_determinism", "do not store and compare each first emit's count and checksum"),
    ("warm_up", "skip the warm-up: the spout's sample run through the topology before txid 1"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="transactional",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_verbose(parser, default=0)
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run a topology: FACTORY is module:function")
    run.add_argument("factory", metavar="MODULE:FACTORY")
    run.add_argument("--topology-id", metavar="ID")
    _add_store_flags(run)
    run.add_argument("--config", metavar="FILE", help="a TOML file of settings")
    run.add_argument("--master", help="Spark master URL (default local[*])")
    run.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting (spark.*) or a runner setting (e.g. max_pending=4); repeatable",
    )
    for flag, metavar, help_text in _RUN_SETTINGS:
        run.add_argument(flag, metavar=metavar, help=help_text)
    for setting, help_text in RUN_SWITCHES:
        run.add_argument(FLAGS[setting], dest=setting, action="store_false", help=help_text)
    run.add_argument(
        "--until-drained",
        action="store_true",
        default=None,
        help="stop once the source has nothing new and everything is committed",
    )
    run.add_argument(
        "--crash-at",
        metavar="POINT:TXID[,...]",
        help="SIGKILL the process (and its Spark JVM) when txid TXID reaches step POINT "
        f"({', '.join(p.value for p in FaultPoint)}); for crash tests",
    )

    status = commands.add_parser(
        "status",
        help="print a topology's state: its runner's last report (leader, txids in flight, "
        "the last error, records per second, lag), currtx and stored txids",
    )
    status.add_argument(
        "factory",
        nargs="?",
        metavar="MODULE:FUNCTION",
        help="the topology's factory (taking no argument): also show the txid each of its "
        "sinks holds, read from the sink",
    )
    status.add_argument("--topology-id", metavar="ID", default=None)
    status.add_argument("--json", action="store_true", help="print one JSON object, for scripts")
    status.add_argument(
        "--watch",
        action="store_true",
        help="refresh the status in place as a live table until interrupted (Ctrl-C)",
    )
    status.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="--watch: seconds between looks"
    )
    _add_store_flags(status)
    query = commands.add_parser(
        "query",
        help="print the values an aggregate state holds for some keys, read from its sink",
    )
    query.add_argument(
        "factory", metavar="MODULE:FUNCTION", help="the topology's factory (taking no argument)"
    )
    query.add_argument("state", metavar="STATE", help="the state's name (its table's name)")
    query.add_argument(
        "keys",
        nargs="+",
        metavar="KEY",
        help="a key; several key columns joined by ':' (escape ':' and '\\' with '\\'), "
        "'\\N' for a null",
    )
    query.add_argument(
        "--committer",
        metavar="NAME",
        help="the committer keeping the state, when several keep one of that name",
    )
    query.add_argument("--json", action="store_true", help="print one JSON object, for scripts")
    back = commands.add_parser(
        "rewind",
        help="roll a topology's sinks and state back to a committed txid, to process "
        "what came after it again (sinks with history only: Delta)",
    )
    back.add_argument(
        "factory", metavar="MODULE:FUNCTION", help="the topology's factory (taking no argument)"
    )
    back.add_argument("--topology-id", metavar="ID", default=None)
    back.add_argument(
        "--to", type=int, required=True, metavar="TXID", help="the committed txid to go back to"
    )
    back.add_argument(
        "--crash-at", choices=CRASH_POINTS, help="SIGKILL the rewind at that step; for crash tests"
    )
    _add_store_flags(back)
    listing = commands.add_parser("list", help="print the topology ids a state store holds")
    _add_store_flags(listing)
    return parser
