"""Rolling a Delta committer's tables back to a committed txid, for ``transactional
rewind``: each table is restored (Delta time travel, delta-rs's ``RESTORE``) to the
version carrying that txid's marker, and the restore commit carries that marker again.

The marker matters as much as the rows: ``txn`` actions are never undone by a restore
(Delta keeps, per app id, the version of the latest ``txn`` in the log), so without it
the table would still claim the later txids, and their replays would be skipped. Delta
takes the marker as the restore commit's ``txn``, atomically with the restore; the
latest ``txn`` wins, so the table then holds the txid it was rolled back to.

A table that already holds the txid's marker is left as it is (``table_rollback``
plans no restore for it): a rewind that died half-way is finished by running it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from committers.delta._arrow import commit_properties
from committers.delta._parquet import arrow_writable
from committers.delta._snapshot import ATTEMPT_SLOTS, latest_marker, txid_markers
from transactional.committer import Rollback
from transactional.errors import ConfigurationError
from transactional.types import CommitMode


@dataclass(frozen=True)
class TableRollback:
    """One table's part: restore ``location`` to ``version``, writing ``marker``."""

    location: str
    app_id: str
    version: int | None  # None: the table holds the txid already
    marker: int


def table_rollback(location: str, app_id: str, txid: int, mode: CommitMode) -> TableRollback:
    """The version of the table at ``location`` that holds ``txid`` of ``app_id`` (0:
    the version before its first marker), or why there is none."""
    slots = ATTEMPT_SLOTS if mode is CommitMode.OPAQUE else 1
    markers = txid_markers(location, app_id)
    latest = latest_marker(location, app_id)
    held = None if latest is None else latest // slots
    if held is None and txid == 0:
        return TableRollback(location, app_id, None, 0)  # never committed to
    if held is None or held < txid:
        raise ConfigurationError(
            f"cannot rewind Delta table {location} to txid {txid}: it holds "
            + ("no txid" if held is None else f"txid {held}")
            + f" of {app_id!r}, before that; nothing to roll back to"
        )
    found = [(version, marker) for version, marker in markers if marker // slots == txid]
    if found:
        version, marker = found[-1]
    elif txid == 0 and markers and markers[0][0] > 0:
        version, marker = markers[0][0] - 1, 0
    else:
        txids = sorted({marker // slots for _, marker in markers})
        raise ConfigurationError(
            f"cannot rewind Delta table {location} to txid {txid}: no version of it holds "
            f"that txid (its log holds txids {_ranges(txids)}; a txid inside a commit "
            "group has no version of its own, and Delta drops commits older than its log "
            "retention): rewind to a txid it holds"
        )
    if latest == marker:
        return TableRollback(location, app_id, None, marker)
    return TableRollback(location, app_id, version, marker)


def restore(part: TableRollback) -> None:
    """Restore one table, with its marker in the restore commit."""
    from deltalake import DeltaTable

    if part.version is None:
        return
    dt = DeltaTable(part.location)
    if not arrow_writable(dt):
        raise ConfigurationError(
            f"cannot rewind Delta table {part.location}: it uses table features (deletion "
            "vectors or column mapping) delta-rs does not restore"
        )
    dt.restore(part.version, commit_properties=commit_properties((part.app_id, part.marker)))


def rollback(parts: Sequence[TableRollback], txid: int) -> Rollback:
    steps = [
        f"{p.location}: holds txid {txid} already"
        if p.version is None
        else f"{p.location}: restore version {p.version} (txid {txid})"
        for p in parts
    ]

    def apply() -> None:
        for part in parts:
            restore(part)

    return Rollback(steps, apply)


def _ranges(txids: list[int]) -> str:
    """``[1, 2, 3, 5]`` as ``1..3, 5``."""
    out: list[str] = []
    start = prev = None
    for t in [*txids, None]:
        if t is not None and prev is not None and t == prev + 1:
            prev = t
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}..{prev}")
        start = prev = t
    return ", ".join(out) or "none"
