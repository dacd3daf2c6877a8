"""Reading all of a Delta committer's tables as of one committed txid.

A txid's Delta commit is one atomic Delta commit per table, so a reader that loads the
tables one after the other while a commit runs may see one table at txid t and another
at t-1. Every table's commit carries the committer's txid marker (a ``txn`` action:
app id ``<topology id>:<committer name>:<table>`` plus ``:opaque`` in opaque mode,
version = the txid, or ``txid * ATTEMPT_SLOTS + n`` in opaque mode), and every txid
writes every table (an empty batch too). So the version of a table "as of txid t" is
the last Delta version whose marker is at most t, and time travel
(``versionAsOf``) reads it.

Which txids are safe to read: in transactional mode, a txid every table holds is final
(a replay of it is skipped). In opaque mode, a replay of the last txid rewrites it,
table by table, possibly with other contents; a txid is known final once some table
holds a later one (the runner begins committing t+1 only after t is committed
everywhere). So ``txid=None`` reads the latest final txid: the lowest txid over the
tables in transactional mode; in opaque mode that same txid if some table is already
ahead, else the one before it. An explicit ``txid`` must be held by every table; in
opaque mode the latest such txid may still be rewritten by a replay (pass the state
store's ``currtx - 1`` to read the txid the runner has committed).

The latest marker of a table is read with ``deltalake``'s public API (``latest_marker``).
The history of markers a snapshot needs has no API: it is read from the table's JSON
commit files (``_delta_log/<version>.json``, whose ``txn`` actions the Delta protocol
specifies), through pyarrow's file systems, on a local disk or in S3 (each file once:
commit files never change). Delta deletes JSON commits older than the
log retention (``delta.logRetentionDuration``, default 30 days) once a checkpoint covers
them, and VACUUM deletes the data files old versions need: a txid older than either
cannot be read as a snapshot, and the error says so.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from committers.delta._location import local_dir, table_root
from transactional.errors import CommitError, ConfigurationError
from transactional.spark.storage import arrow_file_system
from transactional.types import CommitMode, CommitOutcome

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "ATTEMPT_SLOTS",
    "DeltaSnapshot",
    "latest_marker",
    "next_marker",
    "read_snapshot",
    "txid_markers",
]

#: Opaque mode's marker version is ``txid * ATTEMPT_SLOTS + n`` (n: rewrites of txid).
ATTEMPT_SLOTS = 1_000_000

_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")

#: (log dir, app id) -> {Delta version: (mtime_ns, size, marker version or None)}: each
#: commit file is read once (a table recreated at the same path has other files).
_seen: dict[tuple[str, str], dict[int, tuple[int, int, int | None]]] = {}
_seen_lock = threading.Lock()


@dataclass(frozen=True)
class DeltaSnapshot:
    """Tables as of one committed ``txid``: ``versions`` maps each table to the Delta
    version that holds that txid, and ``table(name)`` reads it (time travel)."""

    txid: int
    versions: Mapping[str, int]
    path: str
    spark: SparkSession

    def location(self, table: str) -> str:
        return f"{self.path}/{table}"

    def table(self, name: str) -> DataFrame:
        """The table ``name`` as of ``txid`` (for counters: the key columns and
        ``count``, plus ``prev`` and ``txid`` in opaque mode)."""
        if name not in self.versions:
            raise ConfigurationError(
                f"table {name!r} is not in this snapshot; it has {sorted(self.versions)}"
            )
        return (
            self.spark.read.format("delta")
            .option("versionAsOf", self.versions[name])
            .load(self.location(name))
        )


def _read_marker(fs: Any, path: str, app_id: str) -> int | None:
    try:
        with fs.open_input_stream(path) as stream:
            text = stream.read().decode("utf-8")
    except FileNotFoundError:  # removed by log cleanup since listed
        return None
    for line in text.splitlines():
        if '"txn"' in line:
            txn = json.loads(line).get("txn")
            if txn and txn.get("appId") == app_id:
                return int(txn["version"])
    return None


def txid_markers(location: str, app_id: str) -> list[tuple[int, int]]:
    """``(Delta version, marker version)`` of every JSON commit of the table at
    ``location`` (a local directory or an S3 URL, reached by pyarrow's file systems
    with the standard AWS settings) that carries ``app_id``'s marker, in version order."""
    import pyarrow.fs as pa_fs

    log_dir = f"{location}/_delta_log"
    local = local_dir(location)
    fs, path = arrow_file_system(str(local / "_delta_log") if local else log_dir)
    listed = fs.get_file_info(pa_fs.FileSelector(path, allow_not_found=True))
    if not listed:
        raise ConfigurationError(f"no Delta table at {location}: nothing was committed there")
    with _seen_lock:
        seen = _seen.setdefault((log_dir, app_id), {})
        versions = {}
        for info in listed:
            match = _COMMIT_FILE.match(info.base_name)
            if match is None:
                continue
            version = int(match.group(1))
            stamp = (info.mtime_ns or 0, info.size or 0)
            cached = seen.get(version)
            if cached is None or cached[:2] != stamp:
                cached = (*stamp, _read_marker(fs, info.path, app_id))
                seen[version] = cached
            versions[version] = cached[2]
    return sorted((v, m) for v, m in versions.items() if m is not None)


def latest_marker(location: str, app_id: str) -> int | None:
    """The marker version ``app_id`` last wrote to the table at ``location``: what the
    committer reads before each write, so it must be exact and cheap.

    Read with the ``deltalake`` package (delta-rs), whose public
    ``DeltaTable.transaction_version`` reads the same ``txn`` action delta-spark writes,
    from the table's latest version, loaded afresh (about 10 ms on a local table: the
    last checkpoint and the commits after it). On an object store, ``deltalake`` takes
    its credentials from the environment (``AWS_*``, ``AZURE_*``, ``GOOGLE_*``)."""
    from deltalake import DeltaTable

    return DeltaTable(location).transaction_version(app_id)


def next_marker(
    recorded: int | None,
    span: tuple[int, int],
    mode: CommitMode,
    where: str,
    checked: bool = True,
) -> tuple[int | None, CommitOutcome]:
    """The marker version a commit of the txids ``span`` (``(first, last)``: one txid,
    or a commit group) writes to a table that holds ``recorded`` (None: no marker yet),
    and what the commit does: None and ``SKIPPED`` when a transactional table holds the
    last txid; in opaque mode the next rewrite of it. A table holding a txid inside the
    group (the group is always written whole) is refused. Not ``checked``
    (``at_least_once``, ``at_most_once``; transactional mode): always applied, and the
    marker never moves back."""
    first, txid = span
    if mode is CommitMode.TRANSACTIONAL and not checked:
        return max(txid, recorded or 0), CommitOutcome.APPLIED
    if mode is CommitMode.TRANSACTIONAL:
        if recorded is not None and recorded >= txid:
            return None, CommitOutcome.SKIPPED
        if recorded is not None and recorded >= first:
            raise _split(where, recorded, first, txid)
        return txid, CommitOutcome.APPLIED
    held = None if recorded is None else recorded // ATTEMPT_SLOTS
    if held is None or held < first:
        return txid * ATTEMPT_SLOTS, CommitOutcome.APPLIED
    if held > txid:
        raise CommitError(
            f"opaque commit of txid {txid} refused: {where} already holds txid {held}. The "
            "sink is ahead of the state store; was the store reset or another topology "
            "given this path?"
        )
    if held < txid:
        raise _split(where, held, first, txid)
    assert recorded is not None
    if (recorded + 1) // ATTEMPT_SLOTS != txid:
        raise CommitError(f"txid {txid} was rewritten {ATTEMPT_SLOTS} times; giving up")
    return recorded + 1, CommitOutcome.REAPPLIED


def _split(where: str, held: int, first: int, last: int) -> CommitError:
    return CommitError(
        f"commit of txids {first}..{last} refused: {where} holds txid {held}, inside the "
        "group. A commit group is written whole; was the state store reset?"
    )


def read_snapshot(
    spark: SparkSession,
    path: str,
    topology_id: str,
    committer_name: str,
    tables: Sequence[str],
    txid: int | None = None,
    mode: CommitMode | str | None = None,
) -> DeltaSnapshot:
    """The tables ``tables`` (names under ``path``) as of one committed txid of the
    committer ``committer_name`` of topology ``topology_id``: the latest final one
    (``txid=None``), or ``txid``. ``mode`` (None: found from the markers) is the
    committer's. Raises ``ConfigurationError`` when no such txid is there to read."""
    if not tables:
        raise ConfigurationError("a snapshot of no tables: name the tables to read")
    path = table_root(path)
    prefix = f"{topology_id}:{committer_name}"
    markers = {t: _table_markers(path, prefix, t, mode) for t in tables}
    opaque = any(is_opaque for is_opaque, _ in markers.values())
    if any(is_opaque != opaque for is_opaque, _ in markers.values()):
        raise ConfigurationError(f"the tables under {path} were written in different modes")
    slots = ATTEMPT_SLOTS if opaque else 1
    held = {t: found[-1][1] // slots for t, (_, found) in markers.items()}
    lowest = min(held.values())
    if txid is None:
        txid = lowest if not opaque or max(held.values()) > lowest else lowest - 1
        if txid < 1:
            raise ConfigurationError(
                f"no txid of {prefix} is known final under {path} yet (opaque mode: the "
                f"tables hold txid {lowest}, final once the next one begins); pass "
                "txid= to read it anyway"
            )
    elif txid > lowest or txid < 1:
        raise ConfigurationError(
            f"txid {txid} is not held by every table of {prefix} under {path}: they hold "
            f"{dict(sorted(held.items()))}"
        )
    versions = {}
    for table, (_, found) in markers.items():
        before = [version for version, marker in found if marker // slots <= txid]
        if not before:
            raise ConfigurationError(
                f"txid {txid} is older than the log of {path}/{table} keeps (its oldest "
                f"commit file carries txid {found[0][1] // slots}): Delta removed the "
                "commits before its log retention"
            )
        versions[table] = before[-1]
    return DeltaSnapshot(txid, versions, path, spark)


def _table_markers(
    path: str, prefix: str, table: str, mode: CommitMode | str | None
) -> tuple[bool, list[tuple[int, int]]]:
    """(opaque?, markers) of one table; the mode is found when not given."""
    location = f"{path}/{table}"
    modes = [CommitMode(mode)] if mode is not None else list(CommitMode)
    for candidate in modes:
        opaque = candidate is CommitMode.OPAQUE
        found = txid_markers(location, f"{prefix}:{table}" + (":opaque" if opaque else ""))
        if found:
            return opaque, found
    raise ConfigurationError(
        f"Delta table {location} holds no txid of committer {prefix!r}"
        + ("" if mode is None else f" in {CommitMode(mode).value} mode")
        + ": check the path, topology id and committer name"
    )
