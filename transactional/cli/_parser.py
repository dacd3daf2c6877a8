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
each overriding the one before (``transactional.cli.settings``); only this edge reads the
environment.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from transactional.cli._rewind import CRASH_POINTS
from transactional.cli.settings import add_flags, nearest


class _Parser(argparse.ArgumentParser):
    """The top-level parser. A mistyped command or flag is one line that names it and
    the nearest one of that command, instead of the top-level usage: argparse checks
    the command before its flags, and leaves the flags it does not know to the top."""

    commands: dict[str, argparse.ArgumentParser]

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        argv = list(sys.argv[1:] if args is None else args)
        self._check_command(argv)
        parsed, extras = self.parse_known_args(argv, namespace)
        if extras:
            self._unknown(parsed.command, extras)
        return parsed

    def _check_command(self, argv: list[str]) -> None:
        # The top level's own options (-h, -v) take no value: the first other word is
        # the command.
        word = next((a for a in argv if not a.startswith("-")), None)
        if word is None or word in self.commands:
            return
        near = nearest(word, self.commands)
        hint = f"did you mean {near!r}? " if near else ""
        self._refuse(
            self.prog,
            f"unknown command {word!r}: {hint}(the commands: {', '.join(self.commands)})",
        )

    def _unknown(self, command: str, extras: list[str]) -> NoReturn:
        """The flags ``command`` does not take (a value after one is its own), or, with
        none, the words it did not expect."""
        parser = self.commands[command]
        prog = f"{self.prog} {command}"
        flags = [a.split("=", 1)[0] for a in extras if a.startswith("-") and a != "-"]
        if not flags:
            self._refuse(prog, f"unexpected argument(s) {' '.join(extras)}")
        known = [o for action in parser._actions for o in action.option_strings]
        parts = []
        for flag in flags:
            elsewhere = [c for c, p in self.commands.items() if flag in _options(p)]
            near = nearest(flag, known)
            if elsewhere:
                parts.append(f"{flag} is a flag of {self.prog} {' and '.join(elsewhere)} only")
            elif near:
                parts.append(f"unknown flag {flag}: did you mean {near}?")
            else:
                parts.append(f"unknown flag {flag}")
        self._refuse(prog, f"{'; '.join(parts)} (`{prog} --help` lists its flags)")

    def _refuse(self, prog: str, message: str) -> NoReturn:
        self.exit(2, f"{prog}: error: {message}\n")


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def _add_verbose(parser: argparse.ArgumentParser, default: Any = argparse.SUPPRESS) -> None:
    """``-v`` before or after the command (``transactional run ... -v``)."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default,
        help="log INFO and the libraries' warnings (-vv: DEBUG; -vvv: the libraries' too); "
        "without it only our warnings and the libraries' errors show",
    )


def _add_settings(parser: argparse.ArgumentParser, command: str) -> None:
    """``-v``, ``--config`` and the flags of ``command``'s settings
    (``transactional.cli.settings.SETTINGS``)."""
    _add_verbose(parser)
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a TOML file of settings"
        + ("" if command == "run" else ", as `run` takes: its topology id and store are read"),
    )
    add_flags(parser, command)


def build_parser() -> _Parser:
    parser = _Parser(
        prog="transactional",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_verbose(parser, default=0)
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=argparse.ArgumentParser
    )
    parser.commands = commands.choices

    run = commands.add_parser("run", help="run a topology: FACTORY is module:function")
    run.add_argument("factory", metavar="MODULE:FACTORY")
    _add_settings(run, "run")
    run.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting (spark.*) or a runner setting (e.g. max_pending=4); repeatable",
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
    status.add_argument("--json", action="store_true", help="print one JSON object, for scripts")
    status.add_argument(
        "--watch",
        action="store_true",
        help="refresh the status in place as a live table until interrupted (Ctrl-C)",
    )
    status.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="--watch: seconds between looks"
    )
    _add_settings(status, "status")
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
        help="a key: its columns' values joined by ':', in a value each '\\' written "
        "'\\\\' and, for a key of several columns, each ':' written '\\:'; '\\N' for a "
        "null value",
    )
    query.add_argument(
        "--committer",
        metavar="NAME",
        help="the committer keeping the state, when several keep one of that name",
    )
    query.add_argument("--json", action="store_true", help="print one JSON object, for scripts")
    _add_verbose(query)
    back = commands.add_parser(
        "rewind",
        help="roll a topology's sinks and state back to a committed txid, to process "
        "what came after it again (sinks with history only: Delta)",
    )
    back.add_argument(
        "factory", metavar="MODULE:FUNCTION", help="the topology's factory (taking no argument)"
    )
    back.add_argument(
        "--to", type=int, required=True, metavar="TXID", help="the committed txid to go back to"
    )
    back.add_argument(
        "--crash-at", choices=CRASH_POINTS, help="SIGKILL the rewind at that step; for crash tests"
    )
    _add_settings(back, "rewind")
    listing = commands.add_parser("list", help="print the topology ids a state store holds")
    _add_settings(listing, "list")
    return parser
