"""The settings of the ``transactional`` commands, declared once (``SETTINGS``) and
built at the edge from a config file, ``TRANSACTIONAL_*`` environment variables,
``--conf`` items and flags (in that order, each overriding the one before); components
only ever see the frozen models built here.

A config file (``--config topology.toml``)::

    topology_id = "payments"
    master = "local[4]"
    state_dir = ".transactional"      # or: zookeeper = "zk1:2181,zk2:2181/prod"
    batch_size = "auto"               # or a number of records per txid
    until_drained = false

    [runner]                          # any RunnerConfig field
    max_pending = 4
    attempt_timeout_s = 120

    [spark]                           # any Spark setting
    "spark.sql.shuffle.partitions" = "8"

Environment: ``TRANSACTIONAL_<NAME>`` for every setting of the table
(``TRANSACTIONAL_TOPOLOGY_ID``, ``TRANSACTIONAL_MAX_PENDING``, ...). A name, key or
variable of ours that names no setting is refused with the nearest one (``nearest``),
never ignored: a misspelt setting would run with the default in its place.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import tomllib
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from transactional.config import RunnerConfig
from transactional.errors import ConfigurationError
from transactional.faults import FaultPoint
from transactional.flow import BatchSizeConfig

#: RunnerConfig fields a run may set (the topology id is a top-level setting).
RUNNER_FIELDS = tuple(name for name in RunnerConfig.model_fields if name != "topology_id")

#: The commands of ``transactional`` that take a setting: ``run``, and the ones that
#: only look at (or rewind) a topology's state in its store.
RUN = frozenset({"run"})
#: The runner's own settings alone, as another program's command that runs a topology
#: takes them (``add_flags(parser, RUNNER_ONLY)``: the demo's ``run``, say).
RUNNER_ONLY = "runner"
#: The runner's own settings: on ``run`` and wherever ``RUNNER_ONLY`` is asked for.
RUNNER = frozenset({"run", RUNNER_ONLY})
STORE = frozenset({"run", "status", "rewind", "list"})
TOPOLOGY = frozenset({"run", "status", "rewind"})


@dataclass(frozen=True)
class Setting:
    """One setting, declared once: its flag (``--max-pending``), its environment variable
    (``TRANSACTIONAL_MAX_PENDING``), its key in a config file (at the top, or under
    ``[runner]`` for a ``RunnerConfig`` field) and in ``--conf`` all come from here, and
    its type and default from the model field of the same name (``RunSettings`` or
    ``RunnerConfig``). So a flag cannot be parsed and then dropped: the parser is built
    from this table, and what it parsed is read back by the same names."""

    name: str
    help: str
    #: The value's shape in ``--help``; "" for a switch (a boolean setting).
    metavar: str = ""
    #: The flag, when it is not ``--`` and the name dashed (without a ``_s`` suffix;
    #: ``--no-...`` for a switch that is on by default).
    option: str = ""
    commands: frozenset[str] = RUN
    #: How ``--help`` shows the default, when not as the field's default.
    default_text: str = ""

    @property
    def runner(self) -> bool:
        """A ``RunnerConfig`` field: under ``[runner]`` in a config file."""
        return self.name in RUNNER_FIELDS

    @property
    def field(self) -> Any:
        model = RunnerConfig if self.runner else RunSettings
        return model.model_fields[self.name]

    @property
    def switch(self) -> bool:
        return self.field.annotation in (bool, "bool") or self.both_ways

    @property
    def both_ways(self) -> bool:
        """A switch whose default (None) another setting decides: ``--x`` and ``--no-x``."""
        return bool(self.field.annotation == (bool | None))

    @property
    def flag(self) -> str:
        if self.option:
            return self.option
        dashed = self.name.removesuffix("_s").replace("_", "-")
        return f"--no-{dashed}" if self.switch and self.field.default else f"--{dashed}"

    @property
    def env(self) -> str:
        return f"TRANSACTIONAL_{self.name.upper()}"

    def help_text(self) -> str:
        """The flag's help: what it does, then its default."""
        default = self.field.default
        if self.switch or self.field.is_required():
            return self.help
        shown = self.default_text or (
            "" if default is None else f"{default:g}" if isinstance(default, float) else default
        )
        return f"{self.help} (default {shown})" if shown else self.help


#: Every setting of a run. ``tests/unit/test_cli_settings.py`` checks that it names
#: every field of ``RunSettings`` and ``RunnerConfig`` once; the walks in
#: ``tests/integration/test_cli_flags.py`` (and ``test_cli_store_flags.py``, ``test_demo_flags.py``)
#: that each flag reaches what it controls.
SETTINGS: tuple[Setting, ...] = (
    Setting("topology_id", "the topology's state namespace (required)", "ID", commands=TOPOLOGY),
    Setting(
        "zookeeper",
        "the ZooKeeper state store's servers, host:port[,host:port...][/chroot]",
        "HOSTS",
        commands=STORE,
        default_text="none: the SQLite store in --state-dir",
    ),
    Setting(
        "zk_session_timeout",
        "seconds a ZooKeeper session outlives a runner that stopped answering (a standby "
        "takes over after it)",
        "S",
        commands=STORE,
    ),
    Setting("state_dir", "directory of the embedded SQLite state store", "DIR", commands=STORE),
    Setting("master", "Spark master URL", "URL"),
    Setting(
        "remote",
        "a Spark Connect server to run on, sc://host:port, instead of a Spark driver in this "
        "process (the server then holds the jars: see the Spark Connect how-to)",
        "URL",
        default_text="none",
    ),
    Setting(
        "batch_size",
        "the size of each new txid in its spout's unit (SpoutContext.batch_size): per "
        "partition for Kafka (offsets), Redis Streams (entries) and partitioned or opaque "
        "files (records); per txid for the transactional files spout and a Delta table "
        "(records); auto: adaptive",
        "N|auto",
        default_text="the spout's own",
    ),
    Setting(
        "target_latency_s",
        "with --batch-size auto: the seconds a txid may take from its metadata stored to "
        "its commit; a slower one shrinks the size",
        "S",
        default_text=f"{BatchSizeConfig.model_fields['target_latency_s'].default:g}",
    ),
    Setting("until_drained", "stop once the source has nothing new and everything is committed"),
    Setting(
        "crash_at",
        "SIGKILL the process (and its Spark JVM) when txid TXID reaches step POINT "
        f"({', '.join(p.value for p in FaultPoint)}); for crash tests",
        "POINT:TXID[,...]",
    ),
    Setting("max_pending", "txids in flight", "K", commands=RUNNER),
    Setting(
        "max_group",
        "processed txids committed as one sink write, at most (1: each alone)",
        "K",
        commands=RUNNER,
    ),
    Setting(
        "group_wait_s",
        "seconds a processed txid may wait for the ones after it, to commit with them",
        "S",
        commands=RUNNER,
    ),
    Setting(
        "max_attempts",
        "failures of one txid before the run stops with exit 1",
        "N",
        commands=RUNNER,
    ),
    Setting(
        "attempt_timeout_s",
        "seconds an attempt may process, and again commit, before its Spark jobs are "
        "cancelled and it counts as failed (none: no limit)",
        "S|none",
        commands=RUNNER,
    ),
    Setting(
        "backoff_initial_s", "seconds before a failed txid's first retry", "S", commands=RUNNER
    ),
    Setting("backoff_max_s", "retry back-off limit, doubling up to it", "S", commands=RUNNER),
    Setting(
        "poll_interval_s",
        "seconds before asking the source again when it had nothing new",
        "S",
        commands=RUNNER,
    ),
    Setting(
        "poll_max_s",
        "limit of that wait, which doubles with every poll in a row that finds nothing, "
        "mid-stream too (equal to --poll-interval: no back-off)",
        "S",
        commands=RUNNER,
    ),
    Setting(
        "check_determinism",
        "do not store and compare each first emit's count and checksum",
        option="--no-determinism-check",
        commands=RUNNER,
    ),
    Setting(
        "leader_timeout_s",
        "seconds to wait for leadership, and to get it back (none: no limit)",
        "S|none",
        default_text="none",
        commands=RUNNER,
    ),
    Setting("max_reelections", "leadership losses one run survives", "N", commands=RUNNER),
    Setting(
        "warm_up",
        "run the spout's sample through the topology before txid 1, paying Spark's cold "
        "start there (default: only with --batch-size auto; --no-warm-up: never)",
        commands=RUNNER,
    ),
    Setting(
        "status_interval_s",
        "seconds between the runner's reports to the store, which transactional status "
        "shows (0: none)",
        "S",
        commands=RUNNER,
    ),
    Setting(
        "metrics_port",
        "serve Prometheus metrics at http://HOST:N/metrics while the run lasts",
        "N",
        default_text="none: no server",
        commands=RUNNER,
    ),
    Setting(
        "metrics_host",
        "the metrics server's address (0.0.0.0: every interface)",
        "HOST",
        commands=RUNNER,
    ),
    Setting(
        "lineage",
        "send an OpenLineage run event for each txid attempt, through the OpenLineage "
        "client's own settings (OPENLINEAGE_URL, ...); needs the lineage extra",
        commands=RUNNER,
    ),
    Setting(
        "start_from",
        "where a new topology starts in its source: earliest, latest, an ISO time, a "
        "version, or KEY=OFFSET,...; refused on a topology id that has state",
        "POS",
        default_text="the spout's own start",
        commands=RUNNER,
    ),
    Setting(
        "guarantee",
        "what the run promises for each record: exactly_once, at_least_once (nothing "
        "lost, a replay may count twice) or at_most_once (nothing twice, failures dropped)",
        "exactly_once|at_least_once|at_most_once",
        commands=RUNNER,
    ),
    Setting(
        "ledger",
        "do not check that every bolt accounts for each record it was given",
        option="--no-ledger",
        commands=RUNNER,
    ),
    Setting(
        "ledger_strict",
        "refuse a topology with a bolt the record ledger cannot check",
        commands=RUNNER,
    ),
)
BY_NAME = {s.name: s for s in SETTINGS}


def settings_of(command: str) -> tuple[Setting, ...]:
    return tuple(s for s in SETTINGS if command in s.commands)


def add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags of ``command``'s settings; each parses to None when not given (a
    switch: True or False when given), so the file and environment keep their say."""
    for setting in settings_of(command):
        if setting.both_ways:
            parser.add_argument(
                setting.flag, dest=setting.name, action=argparse.BooleanOptionalAction,
                default=None, help=setting.help_text(),
            )  # fmt: skip
        elif setting.switch:
            action = "store_false" if setting.flag.startswith("--no-") else "store_true"
            parser.add_argument(
                setting.flag, dest=setting.name, action=action, default=None,
                help=setting.help_text(),
            )  # fmt: skip
        else:
            parser.add_argument(
                setting.flag, dest=setting.name, metavar=setting.metavar, default=None,
                help=setting.help_text(),
            )  # fmt: skip


def given_flags(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """What ``add_flags``' flags parsed to, by setting name (None: not given)."""
    return {s.name: getattr(args, s.name) for s in settings_of(command)}


class StoreSettings(BaseModel):
    """Where a topology's state is: what ``status``, ``rewind`` and ``list`` need."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topology_id: str | None = Field(default=None, min_length=1)
    zookeeper: str | None = None
    #: The ZooKeeper session timeout (``ZooKeeperStateStore(session_timeout=...)``).
    zk_session_timeout: float = Field(default=10.0, gt=0)
    state_dir: str = ".transactional"


class RunSettings(StoreSettings):
    """Everything ``transactional run`` needs besides the topology factory."""

    topology_id: str = Field(min_length=1)
    master: str = "local[*]"
    #: A Spark Connect server (``sc://host:port``); None: a classic session on ``master``.
    remote: str | None = None
    #: None: the spout's own size; a number: the size of each new txid, in the spout's
    #: unit (spouts read it through ``SpoutContext.batch_size``); "auto": adaptive
    #: (``transactional.flow``).
    batch_size: int | str | None = None
    #: ``BatchSizeConfig.target_latency_s`` of ``batch_size`` "auto"; None: its default.
    target_latency_s: float | None = Field(default=None, gt=0)
    until_drained: bool = False
    crash_at: str | None = None
    runner: dict[str, Any] = Field(default_factory=dict)
    spark: dict[str, str] = Field(default_factory=dict)

    @field_validator("batch_size")
    @classmethod
    def _batch_size(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, str) and value != "auto":
            try:
                value = int(value)
            except ValueError:
                raise ValueError(f"expected a number or 'auto', not {value!r}") from None
        if isinstance(value, int) and value < 1:
            raise ValueError(f"expected a number of at least 1 or 'auto', not {value}")
        return value

    @field_validator("runner")
    @classmethod
    def _runner_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - set(RUNNER_FIELDS))
        if unknown:
            raise ValueError(f"unknown runner setting(s) {unknown}; known: {list(RUNNER_FIELDS)}")
        return value

    def runner_config(self) -> RunnerConfig:
        try:
            return RunnerConfig(topology_id=self.topology_id, **self.runner)
        except ValidationError as exc:
            raise ConfigurationError(_describe(exc, "runner setting")) from None


def load_settings(
    config_file: str | None,
    env: Mapping[str, str],
    flags: Mapping[str, Any],
    conf: Mapping[str, Mapping[str, Any]] | None = None,
) -> RunSettings:
    """``run``'s settings: the file, then the environment, then ``--conf`` items
    (``parse_conf``), then the other flags (by setting name; None: not given). Raises
    ``ConfigurationError`` with one line per bad setting, naming it and where it came
    from."""
    values, origin = _gather(config_file, env, flags, conf, "run")
    if "topology_id" not in values:
        raise ConfigurationError(
            "no topology id: give --topology-id ID (or TRANSACTIONAL_TOPOLOGY_ID, or "
            "topology_id in the --config file)"
        )
    try:
        settings = RunSettings(**values)
    except ValidationError as exc:
        raise ConfigurationError(_describe(exc, "setting", origin)) from None
    if settings.target_latency_s is not None and settings.batch_size != "auto":
        raise ConfigurationError(
            f"setting target_latency_s={values['target_latency_s']!r} (from "
            f"{origin['target_latency_s']}) sizes txids under --batch-size auto only: add "
            '--batch-size auto (or batch_size = "auto"), or drop it'
        )
    try:  # checked here: before any session or store is touched
        RunnerConfig(topology_id=settings.topology_id, **settings.runner)
    except ValidationError as exc:
        raise ConfigurationError(_describe(exc, "runner setting", origin)) from None
    return settings


def load_store_settings(
    config_file: str | None, env: Mapping[str, str], flags: Mapping[str, Any], command: str
) -> StoreSettings:
    """The store settings of ``command`` (``status``, ``rewind``, ``list``), from the same
    sources as ``run``'s: a config file written for ``run`` serves as it is (its other
    settings are ``run``'s, not read here)."""
    values, origin = _gather(config_file, env, flags, None, command)
    try:
        return StoreSettings(**values)
    except ValidationError as exc:
        raise ConfigurationError(_describe(exc, "setting", origin)) from None


def _gather(
    config_file: str | None,
    env: Mapping[str, str],
    flags: Mapping[str, Any],
    conf: Mapping[str, Mapping[str, Any]] | None,
    command: str,
) -> tuple[dict[str, Any], dict[str, str]]:
    taken = {s.name for s in settings_of(command)}
    values: dict[str, Any] = {"runner": {}, "spark": {}} if command == "run" else {}
    origin: dict[str, str] = {}

    def put(key: str, value: Any, source: str) -> None:
        if key in ("runner", "spark"):
            if command == "run":
                _put(values, origin, key, value, source)
            return
        if key in taken:
            _put(values, origin, key, value, source)

    if config_file:
        for key, value in _read_file(Path(config_file)).items():
            put(key, value, config_file)
    check_environment(env)
    for setting in SETTINGS:
        raw = env.get(setting.env)
        if raw is not None:
            put(setting.name, raw, setting.env)
    for table, items in (conf or {}).items():
        put(table, items, "--conf")
    for key, value in flags.items():
        if value is not None:
            put(key, value, BY_NAME[key].flag if key in BY_NAME else f"--{key}")
    return values, origin


def flags_runner_config(topology_id: str, flags: Mapping[str, Any]) -> RunnerConfig:
    """A ``RunnerConfig`` from the runner settings' flags alone (by setting name; None:
    not given), for a command that has no config file (the demo's ``run``); a bad value
    is one ``ConfigurationError`` naming its flag."""
    given = {name: _runner_value(name, v) for name, v in flags.items() if v is not None}
    origin = {f"runner.{name}": BY_NAME[name].flag for name in given}
    try:
        return RunnerConfig(topology_id=topology_id, **given)
    except ValidationError as exc:
        raise ConfigurationError(_describe(exc, "runner setting", origin)) from None


def parse_conf(items: list[str]) -> dict[str, Any]:
    """``--conf key=value`` items: ``spark.*`` keys are Spark settings; a runner field
    (``max_pending=4``, also as ``runner.max_pending=4``) is a runner setting."""
    out: dict[str, Any] = {"spark": {}, "runner": {}}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigurationError(f"--conf {item!r}: expected key=value")
        if key.startswith("spark."):
            out["spark"][key] = value
            continue
        name = key.removeprefix("runner.")
        if name not in RUNNER_FIELDS:
            near = nearest(name, RUNNER_FIELDS)
            raise ConfigurationError(
                f"--conf {item!r}: {key!r} is neither a Spark setting (spark.*) nor a runner "
                + (
                    f"setting: did you mean {near!r}?"
                    if near
                    else f"setting ({', '.join(RUNNER_FIELDS)})"
                )
            )
        out["runner"][name] = value
    return out


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigurationError(f"config file {path} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"config file {path} cannot be read as TOML: {exc}") from None
    allowed = {*(setting.name for setting in SETTINGS if not setting.runner), "runner", "spark"}
    misplaced = sorted(set(data) & set(RUNNER_FIELDS))
    if misplaced:
        raise ConfigurationError(
            f"config file {path}: {misplaced} are runner settings: put them under [runner]"
        )
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise _unknown_keys(path, unknown, in_runner=False)
    for table in ("runner", "spark"):
        if table in data and not isinstance(data[table], dict):
            raise ConfigurationError(f"config file {path}: [{table}] must be a table")
    unknown = sorted(set(data.get("runner", {})) - set(RUNNER_FIELDS))
    if unknown:
        raise _unknown_keys(path, unknown, in_runner=True)
    if "spark" in data:  # unquoted dotted keys are nested tables in TOML: flatten them
        data["spark"] = _flatten(data["spark"])
    not_spark = sorted(k for k in data.get("spark", {}) if not k.startswith("spark."))
    if not_spark:
        raise ConfigurationError(
            f"config file {path}: {not_spark} in [spark] are not Spark settings: their names "
            'start with "spark." (Hadoop\'s as "spark.hadoop.*")'
        )
    odd = sorted(
        k for k, v in data.get("spark", {}).items() if not isinstance(v, (str, int, float, bool))
    )
    if odd:
        raise ConfigurationError(
            f"config file {path}: {odd} in [spark] must be a string, number or boolean "
            '(a list of jars, packages...: one comma-separated string, "a,b")'
        )
    return data


#: The one variable of ours that is no setting: ``zookeeper_auth``'s.
ZOOKEEPER_AUTH = "TRANSACTIONAL_ZOOKEEPER_AUTH"
PREFIX = "TRANSACTIONAL_"


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name a mistyped ``name`` most likely meant, if one is close enough."""
    found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return found[0] if found else None


def check_environment(env: Mapping[str, str]) -> None:
    """Refuse ``TRANSACTIONAL_*`` variables that name no setting, rather than warn: a
    misspelt one would run the topology with the default in its place (a
    ``TRANSACTIONAL_ZOOKEPER`` on the local SQLite store, beside the runners on
    ZooKeeper), and a warning at start is lost in a service's log."""
    named = [s.env.removeprefix(PREFIX) for s in SETTINGS] + [ZOOKEEPER_AUTH.removeprefix(PREFIX)]
    unknown = sorted(n for n in env if n.startswith(PREFIX) and n.removeprefix(PREFIX) not in named)
    if not unknown:
        return
    near = {n: nearest(n.removeprefix(PREFIX), named) for n in unknown}
    listed = ", ".join(f"{n} (did you mean {PREFIX}{near[n]}?)" if near[n] else n for n in unknown)
    one = len(unknown) == 1
    how = (
        ""
        if all(near.values())
        else f" (a setting's variable is {PREFIX} and its name in capitals: "
        f"{BY_NAME['max_pending'].env} for --max-pending)"
    )
    raise ConfigurationError(
        f"environment variable{'' if one else 's'} {listed} name{'s' if one else ''} no "
        f"setting: rename or unset {'it' if one else 'them'}{how}"
    )


def _unknown_keys(path: Path, keys: list[str], in_runner: bool) -> ConfigurationError:
    """Unknown config file keys, each with the setting it most likely meant and where
    that one goes (at the top, or under ``[runner]``)."""
    described = []
    unmatched = False
    for key in keys:
        near = nearest(key, [*(s.name for s in SETTINGS), "runner", "spark"])
        if near is None:
            described.append(repr(key))
            unmatched = True
            continue
        moved = (near in RUNNER_FIELDS) != in_runner
        where = "" if not moved else ", under [runner]" if not in_runner else ", at the top"
        described.append(f"{key!r} (did you mean {near!r}{where}?)")
    known = (
        list(RUNNER_FIELDS)
        if in_runner
        else sorted({*(s.name for s in SETTINGS if not s.runner), "runner", "spark"})
    )
    return ConfigurationError(
        f"config file {path}: unknown setting{'' if len(keys) == 1 else 's'}"
        f"{' in [runner]:' if in_runner else ''} {', '.join(described)}"
        + (f"; known: {known}" if unmatched else "")
    )


def _put(values: dict[str, Any], origin: dict[str, str], key: str, value: Any, source: str) -> None:
    if key in ("runner", "spark"):
        for name, item in value.items():
            values[key][name] = _spark_value(item) if key == "spark" else _runner_value(name, item)
            origin[f"{key}.{name}"] = source
    elif key in RUNNER_FIELDS:
        values["runner"][key] = _runner_value(key, value)
        origin[f"runner.{key}"] = source
    else:
        values[key] = value
        origin[key] = source


#: Runner fields that may be None (no limit), spelled "none" where a value is text.
NULLABLE = frozenset(
    name
    for name, info in RunnerConfig.model_fields.items()
    if type(None) in typing.get_args(info.annotation)
)


def _runner_value(name: str, value: Any) -> Any:
    """``--attempt-timeout none`` (or ``"none"`` in TOML, which has no null): no limit."""
    if name in NULLABLE and isinstance(value, str) and value.strip().lower() == "none":
        return None
    return value


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``spark.sql.shuffle.partitions = 8`` unquoted is ``{"spark": {"sql": ...}}``."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _spark_value(value: Any) -> str:
    """Spark reads its settings as strings: TOML's ``true`` is Spark's ``"true"``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _describe(exc: ValidationError, what: str, origin: Mapping[str, str] | None = None) -> str:
    lines = []
    for error in exc.errors():
        path = ".".join(str(p) for p in error["loc"])
        name = path.removeprefix("runner.")
        where = (origin or {}).get(path) or (origin or {}).get(f"runner.{path}")
        value = error.get("input")
        source = f" (from {where})" if where else ""
        message = str(error["msg"]).removeprefix("Value error, ")
        if not path and isinstance(value, dict):  # a rule across fields: show each one named
            fields = []
            for field in dict.fromkeys(re.findall(r"[a-z_]+", message)):
                if field in value:
                    given = (origin or {}).get(f"runner.{field}")
                    fields.append(f"{field}={value[field]!r}" + (f" from {given}" if given else ""))
                elif field in RunnerConfig.model_fields:
                    default = RunnerConfig.model_fields[field].default
                    fields.append(f"{field}={default!r} by default")
            lines.append(f"{what}s: {message} ({', '.join(fields)})")
            continue
        shown = "" if isinstance(value, dict) else f"={value!r}"
        lines.append(f"{what} {name}{shown}{source}: {message}")
    return "; ".join(lines)


def environment() -> Mapping[str, str]:
    """Only this edge reads the environment."""
    return os.environ


def zookeeper_auth() -> str | None:
    """ZooKeeper digest credentials, ``user:password``, from ``TRANSACTIONAL_ZOOKEEPER_AUTH``
    only: never a flag or a config file, so they are in no process list, shell history
    or checked-in file."""
    return environment().get(ZOOKEEPER_AUTH) or None
