"""What the Redis committer's script is given: a txid's (or a commit group's) per-field
sums, and the script's argument built from them (``committers/redis_commit.lua``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from committers.counters import CounterTable, Number
from committers.keys import decode_key
from committers.values import ValueType, value_text
from transactional.errors import ContractError
from transactional.types import CommitMode

#: Undo-log value meaning "the field did not exist before this txid". Counts are number
#: strings, so an empty string can never be a real previous value.
ABSENT = ""


@dataclass(frozen=True)
class RedisBatch:
    """What ``prepare`` hands to ``commit``: plain Python, already summed per field
    (hash -> encoded key -> sum in the table's value type), so the serial commit phase
    does no Spark work at all."""

    txid: int
    counters: dict[str, dict[str, Number]] = field(default_factory=dict)
    dead_letters: list[str] = field(default_factory=list)


def combined(
    last: int, batches: Sequence[RedisBatch | None], tables: Mapping[str, CounterTable], who: str
) -> RedisBatch:
    """A commit group's batches (None: a txid that came out empty) as one, marked with
    ``last``: per field, the increments added exactly (Python ints and decimals,
    ``math.fsum`` for doubles); each dead letter keeps its own txid."""
    given = [b for b in batches if b is not None]
    out = RedisBatch(last)
    for name in {name: None for b in given for name in b.counters}:
        table = tables[name]
        double = table.declared.kind == "double"
        totals: dict[str, Number] = {}
        repeated: dict[str, list[Number]] = {}  # doubles: every increment, for fsum
        for batch in given:
            for f, inc in batch.counters.get(name, {}).items():
                if f not in totals:
                    totals[f] = inc
                elif double:
                    repeated.setdefault(f, [totals[f]]).append(inc)
                else:
                    totals[f] = totals[f] + inc  # type: ignore[operator]  # ints, decimals: exact
        for f, values in repeated.items():
            totals[f] = math.fsum(float(v) for v in values)
            if not math.isfinite(totals[f]):
                key = decode_key(f, len(table.keys))
                raise ContractError(
                    f"{who}: Redis hash {name!r} cannot store the group ending at "
                    f"txid {last}: the increments of key {key} sum beyond the largest "
                    "double. Nothing was committed; use a wider value_type for a new hash"
                )
        out.counters[name] = totals
    for batch in given:
        out.dead_letters.extend(batch.dead_letters)
    return out


def script_payload(
    first: int,
    txid: int,
    prepared: RedisBatch,
    tables: Mapping[str, CounterTable],
    mode: CommitMode,
    dead_letters: bool,
    token: int | None,
) -> dict[str, Any]:
    """The script's argument: every increment as text of its declared type, the hashes
    in ``prepared``'s order from key 8."""
    counters = []
    for i, name in enumerate(prepared.counters):
        declared = tables[name].declared
        fields = [
            x
            for f, inc in prepared.counters[name].items()
            for x in (f, increment_text(inc, declared))
        ]
        counters.append(
            {
                "k": 8 + i,
                "kind": declared.kind,
                "type": declared.name,
                "p": declared.precision,
                "s": declared.scale,
                "f": fields,
            }
        )
    payload: dict[str, Any] = {
        "first": str(first),
        "txid": str(txid),
        "mode": mode.value,
        "absent": ABSENT,
        "dl": dead_letters,
        "counters": counters,
        "dead": prepared.dead_letters,
    }
    if token is not None:
        payload["fence"] = str(token)
    return payload


def increment_text(value: Number, declared: ValueType) -> str:
    """``value_text``, except that a group's decimal total is sent with its exact digits
    even past the declared precision: only the new stored value must fit (the script
    checks it)."""
    if declared.kind == "decimal":
        return format(value, "f")
    return value_text(value, declared)
