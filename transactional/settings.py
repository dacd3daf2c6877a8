"""The one settings object of ``transactional run``, built at the edge from a config
file, ``TRANSACTIONAL_*`` environment variables and flags (in that order, each
overriding the one before); components only ever see the frozen models it builds.

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

Environment: ``TRANSACTIONAL_<NAME>`` for every top-level name (``TOPOLOGY_ID``,
``MASTER``, ``ZOOKEEPER``, ``STATE_DIR``, ``BATCH_SIZE``, ``UNTIL_DRAINED``,
``CRASH_AT``) and every runner field (``TRANSACTIONAL_MAX_PENDING``, ...).
"""

from __future__ import annotations

import os
import re
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from transactional.config import RunnerConfig
from transactional.errors import ConfigurationError

#: The flags of ``transactional run`` whose names are not the setting's (for messages).
FLAGS = {
    "attempt_timeout_s": "--attempt-timeout",
    "leader_timeout_s": "--leader-timeout",
    "poll_interval_s": "--poll-interval",
    "poll_max_s": "--poll-max",
    "check_determinism": "--no-determinism-check",
    "warm_up": "--no-warm-up",
    "status_interval_s": "--status-interval",
}
#: RunnerConfig fields a run may set (the topology id is a top-level setting).
RUNNER_FIELDS = tuple(name for name in RunnerConfig.model_fields if name != "topology_id")
_TOP = (
    "topology_id",
    "master",
    "zookeeper",
    "state_dir",
    "batch_size",
    "until_drained",
    "crash_at",
)


class RunSettings(BaseModel):
    """Everything ``transactional run`` needs besides the topology factory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topology_id: str = Field(min_length=1)
    master: str = "local[*]"
    zookeeper: str | None = None
    state_dir: str = ".transactional"
    #: None: the spout's own size; a number: that many records per new txid (spouts read
    #: it through ``SpoutContext.batch_size``); "auto": adaptive (``transactional.flow``).
    batch_size: int | str | None = None
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
    """File, then environment, then ``--conf`` items (``parse_conf``), then the other
    flags (None: not given). Raises ``ConfigurationError`` with one line per bad setting,
    naming it and where it came from."""
    values: dict[str, Any] = {"runner": {}, "spark": {}}
    origin: dict[str, str] = {}
    if config_file:
        for key, value in _read_file(Path(config_file)).items():
            _put(values, origin, key, value, f"{config_file}")
    for key in (*_TOP, *RUNNER_FIELDS):
        raw = env.get(f"TRANSACTIONAL_{key.upper()}")
        if raw is not None:
            _put(values, origin, key, raw, f"TRANSACTIONAL_{key.upper()}")
    for table, items in (conf or {}).items():
        _put(values, origin, table, items, "--conf")
    for key, value in flags.items():
        if value is not None:
            _put(values, origin, key, value, FLAGS.get(key, f"--{key.replace('_', '-')}"))
    if "topology_id" not in values:
        raise ConfigurationError(
            "no topology id: give --topology-id ID (or TRANSACTIONAL_TOPOLOGY_ID, or "
            "topology_id in the --config file)"
        )
    try:
        settings = RunSettings(**values)
    except ValidationError as exc:
        raise ConfigurationError(_describe(exc, "setting", origin)) from None
    try:  # checked here: before any session or store is touched
        RunnerConfig(topology_id=settings.topology_id, **settings.runner)
    except ValidationError as exc:
        raise ConfigurationError(_describe(exc, "runner setting", origin)) from None
    return settings


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
            raise ConfigurationError(
                f"--conf {item!r}: {key!r} is neither a Spark setting (spark.*) nor a runner "
                f"setting ({', '.join(RUNNER_FIELDS)})"
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
    allowed = {*_TOP, "runner", "spark"}
    misplaced = sorted(set(data) & set(RUNNER_FIELDS))
    if misplaced:
        raise ConfigurationError(
            f"config file {path}: {misplaced} are runner settings: put them under [runner]"
        )
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigurationError(
            f"config file {path}: unknown setting(s) {unknown}; known: {sorted(allowed)}"
        )
    for table in ("runner", "spark"):
        if table in data and not isinstance(data[table], dict):
            raise ConfigurationError(f"config file {path}: [{table}] must be a table")
    unknown = sorted(set(data.get("runner", {})) - set(RUNNER_FIELDS))
    if unknown:
        raise ConfigurationError(
            f"config file {path}: unknown runner setting(s) {unknown} in [runner]; known: "
            f"{list(RUNNER_FIELDS)}"
        )
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
    return environment().get("TRANSACTIONAL_ZOOKEEPER_AUTH") or None
