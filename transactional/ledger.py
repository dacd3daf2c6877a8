"""The record ledger's helpers, for bolts that account for their records
(``Bolt.accounts``): the columns the ledger adds (``ID``; ``FOLDED`` and ``XOR`` on an
aggregate row), ``folded``, ``explode``, ``drop``, ``drop_where`` and ``with_ids``.

What the ledger checks, and how a bolt accounts: docs/concepts/ledger.md. How the
runtime keeps its books: docs/architecture.md, "The record ledger".
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from transactional.errors import ContractError, LedgerError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "COLUMNS",
    "DROPPED",
    "FOLDED",
    "ID",
    "XOR",
    "LedgerError",
    "Tally",
    "drop",
    "drop_where",
    "explode",
    "folded",
    "with_ids",
]

#: A record's 64-bit id (LONG), added when the batch is read; null on a row that does
#: not carry a record (a non-first child of an ``explode``).
ID = "__transactional_id"
#: On an aggregate row: how many records it folded (LONG) ...
FOLDED = "__transactional_folded"
#: ... and the XOR of their ids (LONG).
XOR = "__transactional_xor"
#: A row dropped on purpose (its reason): marked in a stream by ``drop_where``, on
#: ``drop``'s rows by the ledger; no committer or bolt is ever given such a row.
DROPPED = "__transactional_dropped"
#: Every column of the ledger: none reaches a committer.
COLUMNS = (ID, FOLDED, XOR, DROPPED)

#: A tally's XOR is an unsigned 64-bit number.
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class Tally:
    """A multiset of record ids, summarised: how many, and their XOR (as an unsigned
    64-bit number). Adding two tallies is the union of the multisets; a tally minus
    another is what the first holds beyond the second."""

    records: int = 0
    xor: int = 0

    @classmethod
    def of(cls, records: Any, xor: Any) -> Tally:
        """From Spark's results: a sum or XOR over no rows is null."""
        return cls(int(records or 0), int(xor or 0) & _MASK)

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.records + other.records, self.xor ^ other.xor)

    def __sub__(self, other: Tally) -> Tally:
        return Tally(self.records - other.records, self.xor ^ other.xor)


def folded() -> list[Column]:
    """The aggregate columns that make a ``groupBy(...).agg(...)`` row account for the
    records it folds: ``frame.groupBy("k").agg(F.count("*"), *folded())``. A row whose
    ``ID`` is null (a non-carrier child) folds nothing."""
    from pyspark.sql import functions as F

    return [
        F.count(F.col(ID)).cast("long").alias(FOLDED),
        F.bit_xor(F.col(ID)).alias(XOR),
    ]


def explode(column: str, alias: str, *, outer: bool = False) -> Column:
    """``F.explode(column).alias(alias)`` that keeps ``ID`` on the first element only:
    the record is carried by one child, so it is counted once however many it has.
    Gives the columns ``alias`` and ``ID``; use it in a ``select`` in place of the
    input's ``ID``. A record whose array is empty or null has no child: ``drop`` it,
    with its reason; or, with ``outer``, it keeps one row, ``alias`` null, that carries
    it (to fold it into a group ``drop_where`` then marks dropped: no second pass)."""
    from pyspark.sql import functions as F

    def child(value: Column, index: Column) -> Column:
        return F.struct(value.alias(alias), F.when(index == 0, F.col(ID)).alias(ID))

    children = F.transform(F.col(column), child)
    if outer:
        # A null of the elements' type (no element 1 there).
        none = F.try_element_at(F.col(column), F.lit(1))
        alone = F.array(F.struct(none.alias(alias), F.col(ID).alias(ID)))
        children = F.when(F.size(F.col(column)) > 0, children).otherwise(alone)
    return F.inline(children)


def drop(frame: DataFrame, reason: str, stream: str | None = None) -> None:
    """Account the records of ``frame`` (rows of the bolt's input, with their ``ID``) as
    dropped on purpose, for ``reason``. Call it inside an accounting bolt's ``process``
    or ``finish_batch``; ``stream`` names the route the records leave (needed only when
    the bolt has several routes). Costs nothing until the txid's jobs run: the rows are
    counted in the job of a committer that reads the route. Outside a runner (a bolt
    called directly, in a test of its own) it does nothing."""
    books = _CURRENT.get()
    if books is not None:
        books.drop(frame, reason, stream)


def drop_where(frame: DataFrame, condition: Column, reason: str) -> DataFrame:
    """``frame`` (an output stream of an accounting bolt) with its rows where
    ``condition`` holds dropped on purpose, for ``reason``: no committer or bolt sees
    them, and the records they carry (their ``ID``, or folded) are accounted as dropped
    on the stream's route. Unlike ``drop``, the rows stay in the stream's own plan,
    so their count comes out of the same pass as the stream's (a committer that
    aggregates the stream again by the bolt's keys needs no second shuffle): fold a
    record that has nothing to count into a group of its own (``explode(...,
    outer=True)``, a null key) and drop that group. Outside a runner, with the ledger
    off, or in a bolt that does not account, the rows are simply left out (a filter)."""
    from pyspark.sql import functions as F

    if not isinstance(reason, str) or not reason:
        raise ContractError("drop_where() needs a reason (a non-empty string)")
    books = _CURRENT.get()
    if books is None or not books.accounts:
        return frame.where(~F.coalesce(condition, F.lit(False)))
    mark = F.when(condition, F.lit(reason))
    if DROPPED in frame.columns:
        mark = F.coalesce(F.col(DROPPED), mark)
    return frame.withColumn(DROPPED, mark)


def with_ids(frame: DataFrame, *, null: bool = False) -> DataFrame:
    """``frame`` with an ``ID`` per row, as the runner gives an accounting bolt its batch:
    to call such a bolt directly (a test, a benchmark's bare baseline). ``null``: ids
    that count nothing, as with the ledger off."""
    from pyspark.sql import functions as F

    if null:
        return frame.withColumn(ID, F.lit(None).cast("long"))
    return frame.withColumn(ID, F.xxhash64(F.monotonically_increasing_id()))


class Books(Protocol):
    """What ``drop`` and ``drop_where`` record into: the runtime's books of the bolt
    being run (``transactional.runtime.ledger_books``)."""

    @property
    def accounts(self) -> bool: ...
    def drop(self, frame: Any, reason: str, stream: str | None) -> None: ...


#: The bolt being run on this thread, for ``drop``.
_CURRENT: contextvars.ContextVar[Books | None] = contextvars.ContextVar(
    "transactional_ledger_bolt", default=None
)


@contextmanager
def recording(books: Books) -> Iterator[None]:
    """While a bolt's ``process`` and ``finish_batch`` run (the runtime says so), what
    ``drop`` and ``drop_where`` are told goes to ``books``."""
    token = _CURRENT.set(books)
    try:
        yield
    finally:
        _CURRENT.reset(token)
