"""What a Delta committer reads back (``DeltaReader``, an object the committer owns): the
values of some keys, the txid markers its tables hold (the committed txid is the lowest
of them); and a rollback of its tables to a txid. Every table as of one txid is
``committers.delta._snapshot``'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from committers.delta._parquet import lookup
from committers.delta._rewind import rollback, table_rollback
from committers.delta._snapshot import ATTEMPT_SLOTS, latest_marker
from committers.delta._tables import brief
from committers.delta._target import DeltaTarget
from committers.tables import CounterTable
from transactional.committer import Rollback
from transactional.errors import CommitError, TransactionalError
from transactional.types import CommitMode

__all__ = ["DeltaReader"]


class DeltaReader:
    """The reading side of a Delta committer's tables: none of it needs the committer
    open, except ``recorded_version`` and ``committed_txid`` (the marker's app id names
    the topology and the committer, known at open)."""

    def __init__(self, target: DeltaTarget) -> None:
        self.mode = target.mode
        self.location = target.location  # table name -> its path
        self._target = target

    def lookup(self, table: CounterTable, keys: list[tuple[Any, ...]]) -> list[Any]:
        """The keys' rows of the table's latest version, read by delta-rs (no Spark)."""
        try:
            return lookup(self.location(table.name), table, keys)
        except (TransactionalError, ValueError):
            raise
        except Exception as exc:
            raise CommitError(
                f"cannot read Delta table {self.location(table.name)}: {brief(exc)}"
            ) from exc

    # -- reading the markers ---------------------------------------------------------

    def recorded_version(self, table: str) -> int | None:
        """The marker version this committer last wrote to ``table``, from a fresh
        version of the table (``committers.delta._snapshot.latest_marker``)."""
        return latest_marker(self.location(table), self._target.app_id(table))

    def committed_txid(self) -> int | None:
        """The lowest txid over all tables (None if a table holds none): tables commit
        independently, so only a txid every table holds is fully committed."""
        return self._held(self.recorded_version)

    def sink_marker(self, topology_id: str, name: str) -> int | None:
        from deltalake.exceptions import TableNotFoundError

        def recorded(table: str) -> int | None:
            app_id = self._target.marker_id(topology_id, name, table)
            try:
                return latest_marker(self.location(table), app_id)
            except TableNotFoundError:
                return None  # never committed to

        return self._held(recorded)

    def rollback(self, topology_id: str, name: str, txid: int) -> Rollback:
        """Every table (dead letters included) restored to its version holding ``txid``
        (``committers.delta._rewind``); refused before anything is written when a table
        has no such version."""
        parts = []
        for table in self._target.names:
            app_id = self._target.marker_id(topology_id, name, table)
            parts.append(table_rollback(self.location(table), app_id, txid, self.mode))
        return rollback(parts, txid)

    def _held(self, recorded: Callable[[str], int | None]) -> int | None:
        held: list[int] = []
        for table in self._target.names:
            try:
                version = recorded(table)
            except Exception as exc:
                raise CommitError(
                    f"cannot read the txid marker of {self.location(table)}: {brief(exc)}"
                ) from exc
            if version is None:
                return None
            held.append(
                version if self.mode is CommitMode.TRANSACTIONAL else version // ATTEMPT_SLOTS
            )
        return min(held)
