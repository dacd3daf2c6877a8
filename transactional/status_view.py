"""``transactional status``: a topology's stored state and its runner's last report
(``transactional.runtime.status``), as lines for a person or one JSON object for a
script."""

from __future__ import annotations

from typing import Any

from transactional.store import JsonValue, StoredState

__all__ = ["status_document", "status_lines", "status_table"]


def status_document(
    topology_id: str,
    state: StoredState,
    report: JsonValue | None,
    sinks: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything ``status`` knows, as JSON values: ``currtx``, the stored metadata of
    each txid still kept (and its partitions'), the commit group, the runner's last
    report (null: no runner has reported) and, given the topology, each sink's txid
    (``{"committer", "txid"}``, or ``"error"``)."""
    return {
        "topology_id": topology_id,
        "currtx": state.currtx,
        "last_committed": state.currtx - 1,
        "stored": {
            str(txid): {
                "committed": txid < state.currtx,
                "meta": state.metas[txid],
                "partitions": {str(p): m for p, m in state.partitions.get(txid, {}).items()},
            }
            for txid in sorted(state.metas)
        },
        "group": list(state.group) if state.group else None,
        "runner": report,
        "sinks": sinks,
    }


def status_lines(
    topology_id: str,
    state: StoredState,
    report: JsonValue | None,
    sinks: dict[str, Any] | None = None,
) -> list[str]:
    lines = [f"topology {topology_id}: currtx={state.currtx}"]
    lines += _report_lines(report)
    lines += _sink_lines(sinks, state.currtx - 1)
    for txid in sorted(state.metas):
        status = "committed" if txid < state.currtx else "started"
        lines.append(f"  txid {txid} ({status}): {state.metas[txid]}")
        for p, meta in sorted(state.partitions.get(txid, {}).items()):
            lines.append(f"    partition {p}: {meta}")
    return lines


def _report_lines(report: JsonValue | None) -> list[str]:
    if not isinstance(report, dict):
        return ["  runner: no report (no run of this topology has published one)"]
    leader = report.get("leader") or {}
    state = "running" if report.get("running") else "stopped"
    lines = [
        f"  runner: {state} on {leader.get('host')} pid {leader.get('pid')}, fence "
        f"{leader.get('fence')}, since {report.get('started_at')}; report of "
        f"{report.get('updated_at')}",
        f"  txids: last committed {report.get('last_committed')}, last stored "
        f"{report.get('last_stored')}; {report.get('committed_txids')} committed by this run",
        f"  records: {report.get('records'):,} committed, {report.get('records_per_s'):,} "
        f"per second over the last minute; lag {_or_unknown(report.get('lag'))}; batch size "
        f"{_or_unknown(report.get('batch_size'))}",
    ]
    for tx in report.get("in_flight") or []:
        lines.append(
            f"  in flight: txid {tx['txid']} attempt {tx['attempt']}, {tx['step']} since "
            f"{tx['since']}"
        )
    failures = report.get("failures") or {}
    if failures or report.get("retries"):
        by_cause = ", ".join(f"{cause} {n}" for cause, n in sorted(failures.items()))
        lines.append(f"  retries: {report.get('retries')}; failures: {by_cause or 'none'}")
    error = report.get("last_error")
    if error:
        lines.append(
            f"  last error: txid {error.get('txid')} ({error.get('phase')}, failure "
            f"{error.get('failures')}) at {error.get('at')}: {error.get('error')}"
        )
    return lines


def _sink_lines(sinks: dict[str, Any] | None, committed: int) -> list[str]:
    """Each sink's txid beside the store's: a sink one group ahead holds a commit whose
    advance was cut short (the next run finds it there and does not write it again)."""
    lines = []
    for name, sink in (sinks or {}).items():
        if "error" in sink:
            lines.append(f"  sink {name} ({sink['committer']}): unknown ({sink['error']})")
            continue
        txid = sink["txid"]
        if txid is None:
            where = "holds no txid"
        elif txid == committed:
            where = f"holds txid {txid}, as the store"
        elif txid > committed:
            where = f"holds txid {txid}, ahead of the store's {committed}: replayed as held"
        else:
            where = f"holds txid {txid}, behind the store's {committed}: it lost commits"
        lines.append(f"  sink {name} ({sink['committer']}): {where}")
    return lines


def _or_unknown(value: Any) -> str:
    return "unknown" if value is None else f"{value:,}"


def status_table(document: dict[str, Any]) -> Any:
    """``status_document``'s view as a ``rich`` table (``status --watch``): one row per
    figure, then one per txid in flight."""
    from rich.table import Table

    report = document.get("runner")
    table = Table(title=f"topology {document['topology_id']}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("currtx", str(document["currtx"]))
    committed = document["currtx"] - 1
    for line in _report_lines(report) + _sink_lines(document.get("sinks"), committed):
        what, _, value = line.strip().partition(": ")
        table.add_row(what, value)
    return table
