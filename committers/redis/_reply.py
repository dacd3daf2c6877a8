"""What the Redis committer's commit script replied (``committers/redis/_commit.lua``):
an outcome, or the error that says what happened and what to change."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from committers.keys import decode_key
from committers.tables import CounterTable
from transactional.errors import CommitError, ConfigurationError, ContractError, FencedError
from transactional.types import CommitMode, CommitOutcome

__all__ = ["ReplyContext", "held_text", "script_outcome"]


@dataclass(frozen=True)
class ReplyContext:
    """Whose reply it is: the committer (as messages name it), its namespace and mode,
    and its counter tables by the Redis key of their hash."""

    who: str
    namespace: str
    mode: CommitMode
    tables: Mapping[str, CounterTable]


def held_text(stored_type: str) -> str:
    """``"max:long"`` as ``"the max of long values"``; ``"long"`` as ``"sums of long
    values"`` (a namespace's record of what a hash holds, ``CounterTable.stored_type``)."""
    aggregate, _, value_type = stored_type.rpartition(":")
    if not aggregate:
        return f"sums of {value_type} values (value_type={value_type!r})"
    return f"the {aggregate} of {value_type} values (aggregate={aggregate!r})"


def script_outcome(
    where: ReplyContext, txid: int, status: str, detail: str, token: int | None
) -> CommitOutcome:
    """What the commit script's reply ``(status, detail)`` for ``txid`` means: an
    outcome, or the error it reports (``token``: the fence token the commit carried)."""
    outcomes = {
        "applied": CommitOutcome.APPLIED,
        "reapplied": CommitOutcome.REAPPLIED,
        "skipped": CommitOutcome.SKIPPED,
    }
    if status in outcomes:
        return outcomes[status]
    if status == "fenced":
        raise FencedError(
            f"Redis namespace {where.namespace!r} refused txid {txid}: it holds "
            f"fence token {detail}, this runner's is {token}. Another runner has led "
            "the topology since this one lost its leadership; nothing was written, "
            "and this runner must stop. (If the state store was reset, reset this "
            "namespace too: tokens start again with the store.)"
        )
    if status == "refused":
        raise ContractError(_refused_values(where, txid, json.loads(detail)))
    if status == "valuetype":
        name, held = json.loads(detail)
        declared = held_text(where.tables[name].stored_type)
        raise ConfigurationError(
            f"{where.who}: Redis hash {name!r} holds {held_text(held)}, but its table "
            f"declares {declared}; nothing was written for txid {txid}. Declare what "
            "it holds, or use a new hash name"
        )
    raise CommitError(_refusal(where, txid, status, detail))


def _refused_values(where: ReplyContext, txid: int, refused: list[list[str]]) -> str:
    problems = []
    for name, encoded, why, base, inc in refused:
        table = where.tables[name]
        key = dict(zip(table.keys, decode_key(encoded, len(table.keys)), strict=True))
        stored = "nothing" if base is None else repr(base)
        if why == "overflow":
            problem = f"holds {stored}; adding {inc} goes beyond {table.value_type}"
        else:
            problem = f"holds {stored}, which is not a {table.value_type} value"
        problems.append(f"hash {name!r} key {key} {problem}")
    return (
        f"{where.who} refused txid {txid}: {'; '.join(problems)}. Nothing was written "
        "(every value is checked before the first write). A sum beyond the type is not "
        "stored wrapped or rounded: use a wider value_type for a new hash; a value "
        "another writer put in the hash must be removed"
    )


def _refusal(where: ReplyContext, txid: int, status: str, detail: str) -> str:
    if status == "split":
        return (
            f"commit of the group ending at txid {txid} refused: Redis namespace "
            f"{where.namespace!r} holds txid {detail}, inside the group. A commit group "
            "is written whole; was the state store reset?"
        )
    if status == "behind":
        return (
            f"opaque commit of txid {txid} refused: Redis namespace {where.namespace!r} "
            f"already holds txid {detail}. The sink is ahead of the state store; was "
            "the store reset or another topology given this namespace?"
        )
    if status == "mode":
        return (
            f"namespace {where.namespace!r} was committed in {detail} mode; this "
            f"committer is in {where.mode.value} mode. Use a new namespace."
        )
    if status == "foreign":
        return (
            f"cannot undo txid {txid}: the tail of list {detail!r} is not the dead "
            "letters it pushed. Another writer appends to it; give this committer "
            "its own dead_letters_key."
        )
    return f"Redis refused txid {txid}: {detail}. Remove or rename the conflicting key."
