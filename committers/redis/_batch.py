"""What the Redis committer's script is given: a txid's (or a commit group's) per-field
sums, and the script's argument built from them (``committers/redis/_commit.lua``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from committers.redis._fields import added, fields_table, texts
from committers.tables import CounterTable, Number
from transactional.types import CommitMode

if TYPE_CHECKING:
    import pyarrow as pa

#: Undo-log value meaning "the field did not exist before this txid". Counts are number
#: strings, so an empty string can never be a real previous value.
ABSENT = ""


@dataclass(frozen=True)
class RedisBatch:
    """What ``prepare`` hands to ``commit``, already summed per field: per hash an Arrow
    table ``(field, inc)`` (``committers.redis._fields``: the encoded key and its sum in
    the hash's value type), and the dead letters as JSON strings. The serial commit
    phase does no Spark work at all."""

    txid: int
    counters: dict[str, pa.Table] = field(default_factory=dict)
    dead_letters: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls, txid: int, sums: Mapping[str, Mapping[str, Number]], dead_letters: Sequence[str] = ()
    ) -> RedisBatch:
        """A batch from sums given in Python (hash -> field -> sum), as a test or a tool
        builds one; the value type is the values' (``fields_table``)."""
        counters = {name: fields_table(fields) for name, fields in sums.items()}
        return cls(txid, counters, list(dead_letters))


def combined(
    last: int, batches: Sequence[RedisBatch | None], tables: Mapping[str, CounterTable], who: str
) -> RedisBatch:
    """A commit group's batches (None: a txid that came out empty) as one, marked with
    ``last``: per field, the increments added exactly (``committers.redis._fields.added``);
    each dead letter keeps its own txid."""
    given = [b for b in batches if b is not None]
    out = RedisBatch(last)
    for name in {name: None for b in given for name in b.counters}:
        parts = [b.counters[name] for b in given if name in b.counters]
        out.counters[name] = added(tables[name], parts, who, last)
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
        names, increments = texts(prepared.counters[name], declared)
        fields: list[str] = [""] * (2 * len(names))
        fields[::2], fields[1::2] = names, increments
        counters.append(
            {
                "k": 8 + i,
                "kind": declared.kind,
                "agg": tables[name].combine,
                "type": tables[name].stored_type,
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
