"""``transactional status``'s view of a stored state (``transactional.cli._status``):
every txid the store keeps is in ``--json``'s ``stored`` with its metadata, and the
plain lines name the ones kept for rewinds in one summary line; the runner's report as
judged (running or not, since when, what replays), with the store's txids over the
report's. The stores' own reads are tested against real servers in
``tests/integration/test_state_stores.py``, a killed run's in ``tests/e2e/test_cli.py``."""

from __future__ import annotations

from typing import Any

from transactional.cli._status import judged, status_document, status_lines, status_table
from transactional.store import Leadership, StoredHistory, StoredState


def test_stored_holds_the_kept_txids_the_history_read_and_the_state_names() -> None:
    state = StoredState(
        currtx=10,
        metas={9: {"at": 9}, 10: {"at": 10}},
        partitions={10: {0: {"p": 10}}},
        kept=(2, 3, 4, 7),
        # Read after the state: 2 was dropped meanwhile, 9 became the last committed
        # and 1 is not among the txids the state names.
        history=StoredHistory(
            metas={1: {"at": 1}, 3: {"at": 3}, 4: {"at": 4}, 7: {"at": 7}, 9: {"at": 9}},
            partitions={3: {1: {"p": 31}, 0: {"p": 30}}, 9: {0: {"stale": True}}},
        ),
    )
    stored = status_document("t", state, None)["stored"]
    assert stored == {
        "3": {"committed": True, "meta": {"at": 3}, "partitions": {"0": {"p": 30}, "1": {"p": 31}}},
        "4": {"committed": True, "meta": {"at": 4}, "partitions": {}},
        "7": {"committed": True, "meta": {"at": 7}, "partitions": {}},
        "9": {"committed": True, "meta": {"at": 9}, "partitions": {}},
        "10": {"committed": False, "meta": {"at": 10}, "partitions": {"0": {"p": 10}}},
    }
    lines = status_lines("t", state, None)
    assert lines[2:] == [
        "  kept for rewinds: 4 committed txids (2..4, 7); `transactional status --json` "
        "shows the metadata of each",
        "  txid 9 (committed): {'at': 9}",
        "  txid 10 (started): {'at': 10}",
        "    partition 0: {'p': 10}",
    ]


def test_without_a_history_read_only_the_state_s_txids_are_stored() -> None:
    state = StoredState(currtx=6, metas={5: {"at": 5}}, kept=(4,))
    assert status_document("t", state, None)["stored"] == {
        "5": {"committed": True, "meta": {"at": 5}, "partitions": {}}
    }
    assert status_lines("t", state, None)[2] == (
        "  kept for rewinds: 1 committed txid (4); `transactional status --json` shows the "
        "metadata of each"
    )


def killed_report(guarantee: str = "exactly_once") -> dict[str, Any]:
    """The last report of a run killed while txids 6 and 7 were in flight."""
    return {
        "running": True,
        "updated_at": "2027-01-15T08:00:00+00:00",
        "started_at": "2027-01-15T07:00:00+00:00",
        "interval_s": 2.0,
        "leader": {"host": "h1", "pid": 41, "fence": 3},
        "last_committed": 5,
        "last_stored": 7,
        "committed_txids": 4,
        "records": 400,
        "records_total": 500,
        "uncounted_txids": 0,
        "records_per_s": 2.5,
        "lag": None,
        "batch_size": 100,
        "guarantee": guarantee,
        "in_flight": [{"txid": 6, "attempt": 1, "step": "process", "since": "x"}],
        "failures": {},
        "retries": 0,
    }


GONE = Leadership(held=False, gone="no process holds its lock file /s/state.db.t.lock")
STATE = StoredState(currtx=6, metas={5: {}, 6: {}, 7: {}})
LATER = 1_800_000_060.0  # a minute after the report


def test_a_killed_runner_is_not_running_in_the_lines_the_json_and_the_table() -> None:
    runner = judged(killed_report(), GONE, LATER)
    why = "no process holds its lock file /s/state.db.t.lock"
    document = status_document("t", STATE, runner)
    assert document["runner"]["running"] is False
    assert document["runner"]["liveness"] == {"why": why, "since": "2027-01-15T08:00:00+00:00"}
    expected = [
        "topology t: currtx=6",
        f"  runner: NOT RUNNING since 2027-01-15T08:00:00+00:00, its last report: {why}; it "
        "ran on h1 pid 41, fence 3, from 2027-01-15T07:00:00+00:00",
        "  txids: last committed 5, last stored 7; 4 committed by its run",
        "  records: 500 committed by all runs; lag unknown; batch size 100",
        "  guarantee: exactly_once",
        "  not committed: txids 6..7 stored; the next run replays them",
    ]
    assert status_lines("t", STATE, runner)[: len(expected)] == expected
    assert rows(document)[1:7] == [
        (what, value) for what, _, value in (e.strip().partition(": ") for e in expected[1:])
    ]


def rows(document: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``--watch`` table's rows: what, then value."""
    table = status_table(document)
    return [
        (str(what), str(value))
        for what, value in zip(table.columns[0].cells, table.columns[1].cells, strict=True)
    ]


def test_at_most_once_says_the_next_run_moves_past_what_a_killed_runner_left() -> None:
    runner = judged(killed_report("at_most_once"), GONE, LATER)
    assert status_lines("t", STATE, runner)[5] == (
        "  not committed: txids 6..7 stored; the next run moves past them, never replaying "
        "one: each is committed where every sink holds it, dropped otherwise"
    )


def test_a_live_runner_shows_its_txids_in_flight() -> None:
    report = {**killed_report(), "updated_at": "2027-01-15T08:00:59+00:00"}
    runner = judged(report, Leadership(held=True, token=3), LATER)
    lines = status_lines("t", STATE, runner)
    assert lines[1] == (
        "  runner: running on h1 pid 41, fence 3, since 2027-01-15T07:00:00+00:00; report "
        "of 2027-01-15T08:00:59+00:00 (it holds the leadership)"
    )
    assert lines[2:4] == [
        "  txids: last committed 5, last stored 7; 4 committed by this run",
        "  records: 500 committed by all runs, 2.5 per second over the last minute; lag "
        "unknown; batch size 100",
    ]
    assert "  in flight: txid 6 attempt 1, process since x" in lines
    assert not [line for line in lines if line.startswith("  not committed")]


def test_after_a_rewind_the_store_s_txids_stand_over_the_report_s() -> None:
    stopped = {**killed_report(), "running": False, "in_flight": []}
    rewound = StoredState(currtx=3, metas={2: {}})  # rewound to txid 2 after the report
    runner = judged(stopped, Leadership(held=False, token=4), LATER)
    lines = status_lines("t", rewound, runner)
    assert lines[1:3] == [
        "  runner: stopped at 2027-01-15T08:00:00+00:00; it ran on h1 pid 41, fence 3, from "
        "2027-01-15T07:00:00+00:00",
        "  txids: last committed 2, last stored 2; 4 committed by its run",
    ]


def test_records_not_counted_and_a_batch_size_not_known_are_said() -> None:
    report = {**killed_report(), "uncounted_txids": 2, "batch_size": None}
    assert status_lines("t", STATE, judged(report, GONE, LATER))[3] == (
        "  records: 500 committed by all runs, besides those of 2 txids committed after a "
        "run's last report; lag unknown; batch size unknown"
    )
