"""``transactional query``: the values an aggregate state holds for some keys, read from
the sink itself (Redis, Delta through delta-rs), without Spark and without the store."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from transactional.cli._factories import topology_without_spark
from transactional.errors import ConfigurationError

__all__ = ["query", "query_document", "query_json", "query_lines"]


def find_state(spec: str, name: str, committer: str | None = None) -> Any:
    """The ``StateReader`` of the state ``name`` among the factory's committers (or
    only ``committer``'s)."""
    topology = topology_without_spark(spec, "query")
    nodes = [n for n in topology.committers if committer is None or n.name == committer]
    if not nodes:
        names = sorted(n.name for n in topology.committers)
        raise ConfigurationError(f"{spec} has no committer {committer!r}; it has {names}")
    keeping = [n for n in nodes if name in n.committer.state_names()]
    if len(keeping) > 1:
        names = sorted(n.name for n in keeping)
        raise ConfigurationError(
            f"committers {names} of {spec} each keep a state {name!r}: choose one with "
            "--committer NAME"
        )
    if not keeping:
        found = sorted({s for n in nodes for s in n.committer.state_names()})
        raise ConfigurationError(
            f"no committer of {spec} keeps a state named {name!r}; its states are {found or 'none'}"
        )
    return keeping[0].committer.state(name)


def query(
    spec: str, name: str, texts: list[str], committer: str | None = None
) -> tuple[Any, list[Any], list[Any]]:
    """The state's table, the keys and the values they hold (None: nothing)."""
    state = find_state(spec, name, committer)
    try:
        keys = state.parse_keys(texts)
        values = state.get(keys)
    except ValueError as exc:
        raise ConfigurationError(f"state {name!r}: {exc}") from exc
    return state.table, keys, values


def _plain(value: Any) -> Any:
    """A value as JSON holds it exactly: a decimal as its text."""
    return format(value, "f") if isinstance(value, Decimal) else value


def query_document(table: Any, keys: list[Any], values: list[Any]) -> dict[str, Any]:
    return {
        "state": table.name,
        "aggregate": table.aggregate,
        "value_type": table.value_type,
        "keys": list(table.keys),
        "values": [
            {"key": list(key), "value": _plain(value)}
            for key, value in zip(keys, values, strict=True)
        ],
    }


def query_json(table: Any, keys: list[Any], values: list[Any]) -> str:
    """``query_document`` as one line of JSON, a key's characters as they are (``#été``,
    not ``#\\u00e9t\\u00e9``)."""
    return json.dumps(query_document(table, keys, values), sort_keys=True, ensure_ascii=False)


def query_lines(table: Any, keys: list[Any], values: list[Any]) -> list[str]:
    """One line per key: the key's columns, each quoted as JSON quotes it but its
    characters as they are, then its value (``(none)``: no value)."""
    lines = []
    for key, value in zip(keys, values, strict=True):
        shown = "(none)" if value is None else str(_plain(value))
        columns = ", ".join(
            f"{c}={json.dumps(v, ensure_ascii=False)}" for c, v in zip(table.keys, key, strict=True)
        )
        lines.append(f"{columns}\t{shown}")
    return lines
