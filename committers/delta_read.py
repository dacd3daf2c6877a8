"""What ``DeltaCommitter`` reads back: the values of some keys, the txid markers its
tables hold (the committed txid is the lowest of them) and every table as of one txid;
and a rollback of its tables to a txid."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from committers.delta_parquet import lookup
from committers.delta_rewind import rollback, table_rollback
from committers.delta_tables import brief
from committers.snapshot import ATTEMPT_SLOTS, latest_marker, read_snapshot
from committers.tables import CounterTable
from transactional.committer import Rollback
from transactional.errors import CommitError, TransactionalError
from transactional.types import CommitMode

__all__ = ["DeltaReads"]


class DeltaReads:
    """The reading side of ``DeltaCommitter``: none of it needs ``open``."""

    mode: CommitMode
    location: Callable[[str], str]
    _app_id: Callable[[str], str]
    _tables: Callable[[], list[str]]

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
        version of the table (``committers.snapshot.latest_marker``)."""
        return latest_marker(self.location(table), self._app_id(table))

    #: ``DeltaCommitter.snapshot(spark, path, topology_id, committer_name, tables,
    #: txid=None, mode=None)``: every table in ``tables`` (counter table names,
    #: ``"dead_letters"``) under ``path`` as of one committed txid of the committer
    #: ``committer_name`` of ``topology_id`` (``committers.snapshot.read_snapshot``).
    snapshot = staticmethod(read_snapshot)

    def committed_txid(self) -> int | None:
        """The lowest txid over all tables (None if a table holds none): tables commit
        independently, so only a txid every table holds is fully committed."""
        return self._held(self.recorded_version)

    def sink_marker(self, topology_id: str, name: str) -> int | None:
        from deltalake.exceptions import TableNotFoundError

        suffix = ":opaque" if self.mode is CommitMode.OPAQUE else ""

        def recorded(table: str) -> int | None:
            try:
                return latest_marker(self.location(table), f"{topology_id}:{name}:{table}{suffix}")
            except TableNotFoundError:
                return None  # never committed to

        return self._held(recorded)

    def rollback(self, topology_id: str, name: str, txid: int) -> Rollback:
        """Every table (dead letters included) restored to its version holding ``txid``
        (``committers.delta_rewind``); refused before anything is written when a table
        has no such version."""
        suffix = ":opaque" if self.mode is CommitMode.OPAQUE else ""
        parts = []
        for table in self._tables():
            app_id = f"{topology_id}:{name}:{table}{suffix}"
            parts.append(table_rollback(self.location(table), app_id, txid, self.mode))
        return rollback(parts, txid)

    def _held(self, recorded: Callable[[str], int | None]) -> int | None:
        held: list[int] = []
        for table in self._tables():
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
