"""``transactional status``'s view of a stored state (``transactional.cli._status``):
every txid the store keeps is in ``--json``'s ``stored`` with its metadata, and the
plain lines name the ones kept for rewinds in one summary line. The stores' own reads
are tested against real servers in ``tests/integration/test_state_stores.py``."""

from __future__ import annotations

from transactional.cli._status import status_document, status_lines
from transactional.store import StoredHistory, StoredState


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
