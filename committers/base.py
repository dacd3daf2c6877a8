"""What the sink-generic committers share: the counter spec, and the checks that make a
wiring mistake fail at construction or on the first batch instead of corrupting a sink."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from transactional.committer import Committer, CommitterContext
from transactional.errors import ConfigurationError
from transactional.types import CommitMode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")

#: Column names the sinks use for their own bookkeeping; a key with one of these names
#: would be overwritten by it.
RESERVED_COLUMNS = frozenset({"count", "prev", "txid", "inc"})


@dataclass(frozen=True, slots=True)
class CounterTable:
    """One counter output: the input rows are ``(keys..., value)`` increments, summed per
    key into the sink (``name`` is the Redis hash / the Delta table directory).

    Increments, not totals, are what a batch carries, because only increments can be
    applied once per txid whatever the sink held before; the sink turns them into
    current counts.
    """

    name: str
    keys: tuple[str, ...]
    value: str = "count"

    def __post_init__(self) -> None:
        if isinstance(self.keys, list):
            object.__setattr__(self, "keys", tuple(self.keys))
        if not _NAME.match(self.name):
            raise ConfigurationError(
                f"counter table name {self.name!r} is not usable as a Redis key and a "
                "directory name: use letters, digits, '_' or '-'"
            )
        if isinstance(self.keys, str) or not self.keys:
            raise ConfigurationError(
                f"counter table {self.name!r}: keys must be a non-empty tuple of column "
                f"names, got {self.keys!r}"
            )
        if len(set(self.keys)) != len(self.keys) or self.value in self.keys:
            raise ConfigurationError(
                f"counter table {self.name!r}: key and value columns must be distinct, "
                f"got keys={self.keys!r} value={self.value!r}"
            )
        clash = RESERVED_COLUMNS.intersection(self.keys)
        if clash:
            raise ConfigurationError(
                f"counter table {self.name!r}: key column(s) {sorted(clash)} clash with "
                f"the sink's own columns {sorted(RESERVED_COLUMNS)}; rename them upstream"
            )


class CounterCommitter(Committer):
    """Base of the committers that add counter increments and append dead letters.

    ``counters`` maps an input name (as wired with ``TopologyBuilder.set_committer``) to
    the table it feeds; ``dead_letters`` names the input carrying ``(raw, reason)`` rows.
    Each sink object (hash, table, list) must be written by one committer only: opaque
    mode undoes a txid by restoring what the sink held before it, which would also wipe
    another writer's changes made since.
    """

    def __init__(
        self,
        counters: Mapping[str, CounterTable],
        dead_letters: str | None = None,
        mode: CommitMode = CommitMode.TRANSACTIONAL,
    ) -> None:
        mode = CommitMode(mode)
        # The ABC declares ``mode`` as a class-level default so that simple committers
        # need not set it; these committers support both modes, chosen per instance.
        self.mode = mode  # type: ignore[misc]
        self.counters: dict[str, CounterTable] = dict(counters)
        self.dead_letters = dead_letters
        names = [table.name for table in self.counters.values()]
        if len(set(names)) != len(names):
            raise ConfigurationError(
                f"two counter inputs feed the same table ({sorted(names)}): union the "
                "streams upstream or give the tables distinct names"
            )
        if dead_letters is not None and dead_letters in self.counters:
            raise ConfigurationError(
                f"input {dead_letters!r} is configured both as counters and as dead letters"
            )
        if not self.counters and dead_letters is None:
            raise ConfigurationError(
                "a committer with no counters and no dead letters writes nothing"
            )
        self.context: CommitterContext | None = None

    def _context(self) -> CommitterContext:
        if self.context is None:
            raise ConfigurationError(
                f"{type(self).__name__} used before open(): the runner must open committers first"
            )
        return self.context

    def check_inputs(self, inputs: Mapping[str, DataFrame]) -> None:
        """Refuse a batch whose streams do not match the configuration: a missing stream
        would silently commit nothing for it, an unknown one would be silently dropped."""
        expected = set(self.counters)
        if self.dead_letters is not None:
            expected.add(self.dead_letters)
        if set(inputs) != expected:
            raise ConfigurationError(
                f"{type(self).__name__} expects inputs {sorted(expected)} but was given "
                f"{sorted(inputs)}: make set_committer(inputs=...) use the names passed "
                "as counters= and dead_letters="
            )
        for input_name, table in self.counters.items():
            columns = set(inputs[input_name].columns)
            missing = [c for c in (*table.keys, table.value) if c not in columns]
            if missing:
                raise ConfigurationError(
                    f"input {input_name!r} for counter table {table.name!r} lacks column(s) "
                    f"{missing}; it has {sorted(columns)}"
                )
        if self.dead_letters is not None:
            columns = set(inputs[self.dead_letters].columns)
            if not {"raw", "reason"} <= columns:
                raise ConfigurationError(
                    f"dead-letter input {self.dead_letters!r} must have columns 'raw' and "
                    f"'reason'; it has {sorted(columns)}"
                )
