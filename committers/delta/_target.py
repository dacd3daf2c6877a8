"""What a Delta committer's parts share: ``DeltaTarget`` (its mode, where its tables
are, and the app id of its txid marker in each), which its two writers and its reader
are given, and ``Writer``, the interface of the two writers it picks between."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from committers.delta._sql import merge_overflow_error
from transactional.committer import CommitterContext
from transactional.errors import FencedError
from transactional.types import CommitMode, CommitOutcome

if TYPE_CHECKING:
    from committers.tables import CounterTable
    from transactional.errors import ContractError

__all__ = ["DEAD_LETTERS_TABLE", "DeltaTarget", "Writer", "log_merged"]

log = logging.getLogger("committers.delta")

#: The dead letters' table, beside the counter tables.
DEAD_LETTERS_TABLE = "dead_letters"

#: What a writer writes: an Arrow table on the driver, or a Spark frame.
Rows = TypeVar("Rows", contravariant=True)


@dataclass(frozen=True)
class DeltaTarget:
    """A Delta committer's tables, as its writers and its reader see them. ``context``
    and ``who`` are the committer's own (its context once open, else a
    ``ConfigurationError``; its name for messages), read when called."""

    mode: CommitMode
    #: The directory of the tables.
    root: str
    #: Every table's name, the dead letters' included.
    names: tuple[str, ...]
    context: Callable[[], CommitterContext]
    who: Callable[[], str]
    #: Compact a table (``DriverWriter``) once it holds more files than this; 0: never.
    compact_files: int

    def location(self, table: str) -> str:
        return f"{self.root}/{table}"

    def marker_id(self, topology_id: str, name: str, table: str) -> str:
        """The app id of the txid marker committer ``name`` of ``topology_id`` writes to
        ``table`` (suffixed ``:opaque`` in opaque mode, whose versions count attempts)."""
        suffix = ":opaque" if self.mode is CommitMode.OPAQUE else ""
        return f"{topology_id}:{name}:{table}{suffix}"

    def app_id(self, table: str) -> str:
        """The app id of this committer's marker in ``table`` (known once open)."""
        context = self.context()
        return self.marker_id(context.topology_id, context.name, table)

    def fence_id(self, table: str) -> str:
        """The app id under which a table keeps the fence token of the last runner that
        claimed it (known once open)."""
        context = self.context()
        return f"{context.topology_id}:{context.name}:{table}:fence"

    def note(self) -> str | None:
        """What each commit of this runner's says of its writer, in the commit's
        ``commitInfo.userMetadata`` (``DESCRIBE HISTORY`` shows it): ``{"fence": N}``,
        this leadership's fence token (None without one; ``CommitterContext.writer_note``).
        A table's history then tells which leadership wrote each version, and that none
        wrote after a later one had (``transactional.testing.history.delta_log`` and
        ``deposed``)."""
        return self.context().writer_note

    def check_fence(self, held: int | None, table: str) -> None:
        """Refuse to write ``table`` (``FencedError``) when it holds a fence token above
        this runner's (``held``: the table's, None: none): a runner that led after this
        one has claimed it."""
        token = self.context().fence_token
        if token is None or held is None or held <= token:
            return
        raise FencedError(
            f"Delta table {self.location(table)} was claimed by fence token {held}, this "
            f"runner's is {token}. Another runner has led the topology since this one lost "
            "its leadership; nothing was written, and this runner must stop. (If the state "
            "store was reset, use new tables too: tokens start again with the store.)"
        )

    def overflow(
        self, txid: int, table: CounterTable, rows: list[Any], done: list[str]
    ) -> ContractError:
        """The error of a MERGE into ``table`` that would store a value beyond its type
        (``rows``: the keys, what each holds and what was to be added)."""
        return merge_overflow_error(self.who(), txid, self.location(table.name), table, rows, done)


def log_merged(path: str, table: str, txid: int, began: float, rows: int | None = None) -> None:
    """A MERGE done, at debug level: by which writer (``path``), its rows where known,
    and the seconds since ``began`` (``time.perf_counter``)."""
    log.debug(
        "merged table=%s txid=%d rows=%s seconds=%.3f path=%s",
        table,
        txid,
        "?" if rows is None else rows,
        time.perf_counter() - began,
        path,
    )


class Writer(Protocol[Rows]):
    """One of a Delta committer's two write paths (``DriverWriter``: Arrow tables by
    delta-rs; ``ExecutorWriter``: Spark frames by delta-spark). Each write carries the
    txid marker of ``span`` (the commit's first and last txid) in the same Delta commit,
    and is skipped (``CommitOutcome.SKIPPED``) when the table holds the span already."""

    def merge(
        self, span: tuple[int, int], table: CounterTable, source: Rows, done: list[str]
    ) -> CommitOutcome:
        """``source``, the span's per-key sums, merged into ``table``'s Delta table
        (``done``: the tables of this commit written before, for the error of a sum that
        cannot be stored)."""
        ...

    def dead_letters(self, span: tuple[int, int], rows: Rows) -> CommitOutcome:
        """The span's dead letters appended (opaque: its earlier rows replaced)."""
        ...
