"""``transactional status``: a topology's stored state, its runner's last report
(``transactional.runtime.status``) judged by what the store tells of the leadership
now (``liveness``), and what each sink holds, read only, as lines for a person, one
JSON object for a script, or a live table (``--watch``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from transactional.cli._factories import topology_without_spark
from transactional.errors import TransactionalError
from transactional.runtime.status import STOPPED, liveness
from transactional.store import JsonValue, Leadership, StoredHistory, StoredState, open_store

#: Where the state is: ZooKeeper hosts (None: SQLite), the state directory, the
#: ZooKeeper credentials (``user:password``; None: none) and session timeout: the
#: arguments of ``open_store``.
Where = tuple[str | None, str, str | None, float]

__all__ = [
    "judged",
    "look",
    "sinks",
    "status_document",
    "status_lines",
    "status_table",
    "watch",
]


def status_document(
    topology_id: str,
    state: StoredState,
    report: JsonValue | None,
    sinks: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything ``status`` knows, as JSON values: ``currtx``, the stored metadata of
    each txid the store keeps (and its partitions'): the kept ones below the last
    committed (``state.history``, when read), the last committed and every one started
    since, the commit group, the runner's last report (null: no runner has reported),
    the txids a rewind can go back to, an unfinished rewind and, given the topology,
    each sink's txid (``{"committer", "txid"}``, or ``"error"``). The report is given
    ``judged`` when ``look`` read it."""
    metas, partitions = _stored(state)
    return {
        "topology_id": topology_id,
        "currtx": state.currtx,
        "last_committed": state.currtx - 1,
        "stored": {
            str(txid): {
                "committed": txid < state.currtx,
                "meta": metas[txid],
                "partitions": {str(p): m for p, m in sorted(partitions.get(txid, {}).items())},
            }
            for txid in sorted(metas)
        },
        "group": list(state.group) if state.group else None,
        "rewind_targets": state.rewind_targets,
        "rewinding": state.rewinding,
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
    if state.rewinding is not None:
        lines.append(
            f"  REWINDING to txid {state.rewinding}, unfinished: no run starts until "
            f"`transactional rewind ... --to {state.rewinding}` is run again"
        )
    started = sorted(t for t in state.metas if t >= state.currtx)
    lines += _report_lines(report, state.currtx, started)
    lines += _sink_lines(sinks, state.currtx - 1)
    if state.kept:
        # Up to ``history`` of them (100 by default): one line, their metadata in --json.
        lines.append(
            f"  kept for rewinds: {len(state.kept)} committed txid"
            f"{'' if len(state.kept) == 1 else 's'} ({_spans(state.kept)}); `transactional "
            "status --json` shows the metadata of each"
        )
    for txid in sorted(state.metas):
        status = "committed" if txid < state.currtx else "started"
        lines.append(f"  txid {txid} ({status}): {state.metas[txid]}")
        for p, meta in sorted(state.partitions.get(txid, {}).items()):
            lines.append(f"    partition {p}: {meta}")
    return lines


def _stored(
    state: StoredState,
) -> tuple[dict[int, JsonValue], dict[int, Mapping[int, JsonValue]]]:
    """The metadata and partition metadata of every txid the store keeps: the kept ones
    below the last committed that ``state.history`` holds (those ``state.kept`` names:
    the history, read apart, may have dropped the oldest since, or hold later ones),
    then the last committed and the started ones (``state.metas``)."""
    history = state.history or StoredHistory()
    kept = [t for t in state.kept if t in history.metas]
    metas = {t: history.metas[t] for t in kept} | dict(state.metas)
    partitions = {t: history.partitions[t] for t in kept if t in history.partitions}
    return metas, partitions | dict(state.partitions)


def _spans(txids: tuple[int, ...]) -> str:
    """Sorted txids as runs: ``1..3, 7``."""
    spans: list[list[int]] = []
    for t in txids:
        if spans and t == spans[-1][1] + 1:
            spans[-1][1] = t
        else:
            spans.append([t, t])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in spans)


def judged(report: JsonValue | None, leadership: Leadership, now: float) -> JsonValue | None:
    """The report with ``liveness``'s judgement at wall time ``now``: ``running`` as
    judged, and ``liveness``, why and since when (``{"why", "since"}``)."""
    if not isinstance(report, dict):
        return report
    alive = liveness(report, leadership, now)
    return {
        **report,
        "running": alive.running,
        "liveness": {"why": alive.why, "since": alive.since},
    }


def _report_lines(report: JsonValue | None, currtx: int, started: list[int]) -> list[str]:
    """The report's lines; the txids committed and stored are the store's (``currtx``,
    ``started``: the stored txids from ``currtx`` up), which a rewind moves back."""
    if not isinstance(report, dict):
        return ["  runner: no report (no run of this topology has published one)"]
    leader = report.get("leader") or {}
    where = f"on {leader.get('host')} pid {leader.get('pid')}, fence {leader.get('fence')}"
    since, start = report.get("updated_at"), report.get("started_at")
    running = bool(report.get("running"))
    # A report not ``judged`` (read by other means) says it all itself.
    alive = report.get("liveness") or {
        "why": "as it says" if running else STOPPED,
        "since": None if running else since,
    }
    if running:
        runner = f"running {where}, since {start}; report of {since} ({alive['why']})"
    elif alive["why"] == STOPPED:
        runner = f"stopped at {alive['since']}; it ran {where}, from {start}"
    else:
        runner = (
            f"NOT RUNNING since {alive['since']}, its last report: {alive['why']}; it ran "
            f"{where}, from {start}"
        )
    lines = [
        f"  runner: {runner}",
        f"  txids: last committed {currtx - 1}, last stored {max([currtx - 1, *started])}; "
        f"{report.get('committed_txids')} committed by {'this' if running else 'its'} run",
        f"  records: {_records(report)}"
        + (f", {report.get('records_per_s'):,} per second over the last minute" if running else "")
        + f"; lag {_or_unknown(report.get('lag'))}; batch size "
        f"{_or_unknown(report.get('batch_size'))}",
        f"  guarantee: {report.get('guarantee', 'exactly_once')}",
    ]
    if report.get("dropped_txids"):
        shown = ", ".join(str(d["txid"]) for d in report.get("dropped") or [])
        lines.append(
            f"  dropped: {report['dropped_txids']:,} txids ({shown or 'none listed'}), "
            f"{report.get('dropped_records', 0):,} records counted before they failed; "
            "never retried"
        )
    if running:
        for tx in report.get("in_flight") or []:
            lines.append(
                f"  in flight: txid {tx['txid']} attempt {tx['attempt']}, {tx['step']} since "
                f"{tx['since']}"
            )
    elif started:
        lines.append(f"  not committed: {_replayed(started, report.get('guarantee'))}")
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


def _records(report: dict[str, Any]) -> str:
    """The topology's records committed by every run that reported (a report of an
    older version counts its own run's only)."""
    total = report.get("records_total")
    if total is None:
        return f"{report.get('records'):,} committed by its run"
    uncounted = report.get("uncounted_txids") or 0
    if not uncounted:
        return f"{total:,} committed by all runs"
    return (
        f"{total:,} committed by all runs, besides those of {uncounted:,} txid"
        f"{'' if uncounted == 1 else 's'} committed after a run's last report"
    )


def _replayed(started: list[int], guarantee: Any) -> str:
    """What the next run does with the txids a runner no longer running left stored."""
    some = f"txid{'' if len(started) == 1 else 's'} {_spans(tuple(started))} stored"
    if guarantee == "at_most_once":
        return (
            f"{some}; the next run moves past them, never replaying one: each is committed "
            "where every sink holds it, dropped otherwise"
        )
    return f"{some}; the next run replays {'it' if len(started) == 1 else 'them'}"


def _or_unknown(value: Any) -> str:
    return "unknown" if value is None else f"{value:,}"


def status_table(document: dict[str, Any]) -> Any:
    """``status_document``'s view as a ``rich`` table (``status --watch``): one row per
    figure, then one per txid in flight."""
    from rich.table import Table

    report, currtx = document.get("runner"), document["currtx"]
    started = sorted(int(t) for t, tx in document["stored"].items() if not tx["committed"])
    table = Table(title=f"topology {document['topology_id']}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("currtx", str(currtx))
    lines = _report_lines(report, currtx, started) + _sink_lines(document.get("sinks"), currtx - 1)
    for line in lines:
        what, _, value = line.strip().partition(": ")
        table.add_row(what, value)
    return table


def look(
    where: Where, topology_id: str, factory: str | None, history: bool = True
) -> tuple[Any, Any, Any]:
    """The topology's stored state (with ``history``, unless told not to: the metadata
    of the txids kept for rewinds), its runner's last report, ``judged`` by the store's
    leadership now, and, given the factory, what each sink holds: all read only."""
    store = open_store(*where)
    store.open(topology_id, read_only=True)
    try:
        state, report = store.read_state(), store.read_status()
        report = judged(report, store.read_leadership(), time.time())
        if history:
            state = replace(state, history=store.read_history())
    finally:
        store.close()
    return state, report, sinks(topology_id, factory)


def sinks(topology_id: str, spec: str | None) -> dict[str, Any] | None:
    """Per committer of the factory's topology: the txid its sink holds (or why that
    cannot be told)."""
    if not spec:
        return None
    topology = topology_without_spark(spec, "status")
    held: dict[str, Any] = {}
    for node in topology.committers:
        shown: dict[str, Any] = {"committer": type(node.committer).__name__}
        try:
            shown["txid"] = node.committer.sink_marker(topology_id, node.name)
        except NotImplementedError as exc:
            shown["error"] = str(exc)
        except TransactionalError as exc:
            shown["error"] = f"{type(exc).__name__}: {exc}"
        held[node.name] = shown
    return held


def watch(where: Where, topology_id: str, factory: str | None, interval: float) -> None:
    """``status --watch``: the live table, refreshed every ``interval`` seconds until
    interrupted."""
    from rich.live import Live

    def render() -> Any:
        # The table shows no stored txid: the kept ones' metadata is not read.
        looked = look(where, topology_id, factory, history=False)
        return status_table(status_document(topology_id, *looked))

    try:
        with Live(render(), auto_refresh=False) as live:
            while True:
                time.sleep(max(0.1, interval))
                live.update(render(), refresh=True)
    except KeyboardInterrupt:
        return
