"""One contract for every state store, run against SQLite on disk and a real ZooKeeper;
then what only one backend has (the znode layout, session expiry, the lock file)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from coordinators import SQLiteStateStore, ZooKeeperStateStore
from transactional.cli._status import Where, look, status_document, status_lines
from transactional.errors import (
    ConfigurationError,
    CoordinatorError,
    FencedError,
    LostLeadershipError,
    StoreUnavailableError,
)
from transactional.store import StateStore, StoredHistory, StoredState, TopologyIdentity
from transactional.testing.servers import free_port

pytestmark = pytest.mark.integration

TOPOLOGY = "tweets"
META_1 = {"from": 0, "count": 10, "nested": {"keys": ["a", "é"], "x": [1, 2.5, None, True]}}
META_2 = {"from": 10, "count": 7, "nested": {}}
EMPTY = StoredState(currtx=1, metas={}, partitions={})


def meta(txid: int) -> dict[str, int]:
    return {"from": (txid - 1) * 10, "count": 10}


def part(txid: int, p: int) -> dict[str, object]:
    return {"offset": txid * 100 + p, "partition": p}


def expire_session(hosts: str, store: ZooKeeperStateStore, wait_reconnect: bool) -> None:
    """Kazoo's trick: a second client joins the session and closes it, so the server
    expires it; the first client learns it only when it next talks to the server."""
    session_id, password = store._client.client_id
    intruder = KazooClient(hosts=hosts, client_id=(session_id, password))
    intruder.start(timeout=15)
    intruder.stop()
    intruder.close()
    if wait_reconnect:  # a zombie: back on a new session, writing as if nothing happened
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            current = store._client.client_id
            if store._client.state == "CONNECTED" and current and current[0] != session_id:
                return
            time.sleep(0.05)
        raise AssertionError("the expired client did not reconnect within 15s")


@dataclass
class Backend:
    name: str
    location: str
    _make: Callable[[int], StateStore]
    #: Makes a leading store lose leadership without its knowing (a "zombie").
    steal: Callable[[StateStore], None]
    #: The store as ``transactional status`` finds it (``open_store``'s arguments).
    where: Where
    #: Everything the backend holds, to tell that a look wrote nothing.
    snapshot: Callable[[], object]
    opened: list[StateStore] = field(default_factory=list)

    def open(self, topology_id: str = TOPOLOGY, history: int = 0) -> StateStore:
        """A store on the backend; ``history`` 0 (advance keeps no earlier metadata)
        unless a test is about rewinds."""
        store = self._make(history)
        store.open(topology_id)
        self.opened.append(store)
        return store

    def open_read_only(self, topology_id: str = TOPOLOGY) -> StateStore:
        """A store opened as ``transactional status`` opens it (its own ``history`` 0:
        what it reads does not depend on it)."""
        store = self._make(0)
        store.open(topology_id, read_only=True)
        self.opened.append(store)
        return store


@pytest.fixture(params=["sqlite", "zookeeper"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        db = tmp_path / "state" / "state.db"

        def unlink_lock(store: StateStore) -> None:
            assert isinstance(store, SQLiteStateStore)
            store.lock_path.unlink()

        def files() -> object:
            return {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in db.parent.iterdir()}

        b = Backend(
            "sqlite",
            str(db),
            lambda h: SQLiteStateStore(db, history=h),
            unlink_lock,
            (None, str(db.parent), None, 10.0),
            files,
        )
    else:
        hosts = request.getfixturevalue("zk_hosts")

        def expire(store: StateStore) -> None:
            assert isinstance(store, ZooKeeperStateStore)
            expire_session(hosts, store, wait_reconnect=True)

        b = Backend(
            "zookeeper",
            hosts,
            lambda h: ZooKeeperStateStore(hosts, session_timeout=4.0, history=h),
            expire,
            (hosts, "", None, 10.0),
            lambda: znodes(hosts),
        )
    yield b
    for store in b.opened:
        store.close()


def leader(backend: Backend, history: int = 0) -> StateStore:
    store = backend.open(history=history)
    store.acquire_leadership(timeout=10)
    return store


def test_fresh_state_is_empty(backend: Backend) -> None:
    assert backend.open().read_state() == EMPTY


def test_start_transaction_round_trips_json(backend: Backend) -> None:
    store = leader(backend)
    store.start_transaction(1, META_1, {0: {"o": [1, {"deep": "x"}]}, 3: "plain"})
    store.start_transaction(2, META_2, {})
    store.start_transaction(3, [1, "two"], {0: None})
    expected = StoredState(
        currtx=1,
        metas={1: META_1, 2: META_2, 3: [1, "two"]},
        partitions={1: {0: {"o": [1, {"deep": "x"}]}, 3: "plain"}, 3: {0: None}},
    )
    assert store.read_state() == expected
    assert backend.open().read_state() == expected


def test_start_transaction_refuses_to_overwrite(backend: Backend) -> None:
    store = leader(backend)
    store.start_transaction(1, META_1, {0: part(1, 0)})
    with pytest.raises(CoordinatorError, match="metadata of txid 1 is already stored"):
        store.start_transaction(1, META_2, {0: part(9, 0), 1: part(9, 1)})
    store.start_transaction(2, META_2, {0: part(2, 0)})
    expected = StoredState(
        currtx=1, metas={1: META_1, 2: META_2}, partitions={1: {0: part(1, 0)}, 2: {0: part(2, 0)}}
    )
    assert store.read_state() == expected


def test_start_transaction_refuses_a_committed_txid(backend: Backend) -> None:
    store = leader(backend)
    for txid in (1, 2):
        store.start_transaction(txid, meta(txid), {})
        store.advance(txid)
    with pytest.raises(CoordinatorError, match="txid 1 is already committed"):
        store.start_transaction(1, meta(1), {})
    assert store.read_state() == StoredState(currtx=3, metas={2: meta(2)}, partitions={})


def test_advance_deletes_what_is_below_txid(backend: Backend) -> None:
    store = leader(backend)
    for txid in (1, 2, 3, 4):
        store.start_transaction(txid, meta(txid), {0: part(txid, 0), 1: part(txid, 1)})

    def partitions(*txids: int) -> dict[int, dict[int, object]]:
        return {t: {0: part(t, 0), 1: part(t, 1)} for t in txids}

    store.advance(1)
    assert store.read_state() == StoredState(
        currtx=2, metas={t: meta(t) for t in (1, 2, 3, 4)}, partitions=partitions(1, 2, 3, 4)
    )
    store.advance(2)
    store.advance(3)
    expected = StoredState(currtx=4, metas={3: meta(3), 4: meta(4)}, partitions=partitions(3, 4))
    assert store.read_state() == expected
    assert backend.open().read_state() == expected


def test_advance_stores_opaque_partitions(backend: Backend) -> None:
    store = leader(backend)
    store.start_transaction(1, meta(1), {})
    store.advance(1, {0: part(1, 0), 1: part(1, 1)})
    assert store.read_state() == StoredState(
        currtx=2, metas={1: meta(1)}, partitions={1: {0: part(1, 0), 1: part(1, 1)}}
    )
    store.start_transaction(2, meta(2), {})
    store.advance(2, {0: part(2, 0), 2: part(2, 2)})
    assert store.read_state() == StoredState(
        currtx=3, metas={2: meta(2)}, partitions={2: {0: part(2, 0), 2: part(2, 2)}}
    )


def test_advance_replaces_partition_meta_stored_at_start(backend: Backend) -> None:
    store = leader(backend)
    store.start_transaction(1, meta(1), {0: part(1, 0)})
    store.advance(1, {0: part(5, 0)})
    assert store.read_state() == StoredState(
        currtx=2, metas={1: meta(1)}, partitions={1: {0: part(5, 0)}}
    )


def test_advance_of_another_txid_is_fenced(backend: Backend) -> None:
    store = leader(backend)
    store.start_transaction(1, meta(1), {0: part(1, 0)})
    store.start_transaction(2, meta(2), {0: part(2, 0)})
    before = store.read_state()
    for wrong in (2, 0, 3):
        with pytest.raises(FencedError, match=f"past txid {wrong}: currtx is 1"):
            store.advance(wrong, {0: part(9, 9)})
    assert store.read_state() == before
    assert backend.open().read_state() == before
    store.advance(1)
    assert store.read_state().currtx == 2


def test_digests_are_stored_once_read_back_and_deleted_by_advance(backend: Backend) -> None:
    store = leader(backend)
    for txid in (1, 2, 3):
        store.start_transaction(txid, meta(txid), {0: part(txid, 0)})
    digest_1 = {"0": [10, "-123456789012345678901"], "1": [0, "0"]}
    store.record_digest(1, digest_1)
    store.record_digest(3, {"0": [4, "77"]})
    with pytest.raises(CoordinatorError, match="digest of txid 1 is already stored"):
        store.record_digest(1, {"0": [9, "9"]})
    with pytest.raises(CoordinatorError, match="txid 4: it is not started"):
        store.record_digest(4, {"0": [1, "1"]})
    state = store.read_state()
    assert state.digests == {1: digest_1, 3: {"0": [4, "77"]}}
    assert backend.open().read_state().digests == state.digests
    store.advance(1)
    store.advance(2)
    # A committed txid's digest is gone with it; uncommitted ones stay.
    assert store.read_state().digests == {3: {"0": [4, "77"]}}
    assert backend.open().read_state().digests == {3: {"0": [4, "77"]}}
    store.advance(3)
    assert store.read_state().digests == {}


def test_retract_forgets_started_txids_from_one_up(backend: Backend) -> None:
    store = leader(backend)
    for txid in (1, 2, 3, 4):
        store.start_transaction(txid, meta(txid), {0: part(txid, 0), 1: part(txid, 1)})
    store.record_digest(3, {"0": [1, "5"]})
    store.advance(1)
    store.retract(3)
    expected = StoredState(
        currtx=2,
        metas={1: meta(1), 2: meta(2)},
        partitions={t: {0: part(t, 0), 1: part(t, 1)} for t in (1, 2)},
    )
    assert store.read_state() == expected
    assert backend.open().read_state() == expected
    with pytest.raises(
        FencedError, match="cannot retract txid 1 of topology 'tweets': currtx is 2"
    ):
        store.retract(1)
    # The retracted txids start again, with other metadata.
    store.start_transaction(3, {"again": 3}, {0: part(30, 0)})
    store.advance(2)
    store.advance(3)
    assert store.read_state() == StoredState(
        currtx=4, metas={3: {"again": 3}}, partitions={3: {0: part(30, 0)}}
    )


def test_a_commit_group_is_recorded_once_and_advanced_past_whole(backend: Backend) -> None:
    store = leader(backend)
    for txid in (1, 2, 3, 4):
        store.start_transaction(txid, meta(txid), {0: part(txid, 0)})
    store.record_group(1, 3)
    store.record_group(1, 3)  # the same group again: nothing changes
    assert store.read_state().group == (1, 3)
    assert backend.open().read_state().group == (1, 3)
    with pytest.raises(CoordinatorError, match=r"commit group from txid 1 \(1..3\) is already"):
        store.record_group(1, 2)
    with pytest.raises(CoordinatorError, match="must start at currtx"):
        store.record_group(2, 3)
    with pytest.raises(CoordinatorError, match="every txid of it must be started"):
        store.record_group(1, 5)
    with pytest.raises(CoordinatorError, match="first < last"):
        store.record_group(1, 1)
    with pytest.raises(CoordinatorError, match=r"in the recorded commit group 1\.\.3"):
        store.retract(3)
    with pytest.raises(CoordinatorError, match=r"as one group: the recorded group is 1\.\.3"):
        store.advance(2, first=1)
    with pytest.raises(FencedError, match="past txid 3: currtx is 1"):
        store.advance(3)
    assert backend.open().read_state().currtx == 1
    store.retract(4)  # above the group: allowed
    store.advance(3, {0: part(30, 0)}, first=1)
    expected = StoredState(
        currtx=4, metas={3: meta(3)}, partitions={3: {0: part(30, 0)}}, group=(1, 3)
    )
    assert store.read_state() == expected
    assert backend.open().read_state() == expected  # kept, and binding nothing now:
    store.start_transaction(4, meta(4), {})
    store.start_transaction(5, meta(5), {})
    store.retract(5)  # the old group does not bind: 5 may go
    store.start_transaction(5, meta(5), {})
    store.record_group(4, 5)  # nor does it stop a new group
    store.advance(5, first=4)
    assert store.read_state().group == (4, 5) and store.read_state().currtx == 6


def test_advance_keeps_the_last_history_txids_for_rewinds(backend: Backend) -> None:
    store = leader(backend, history=3)
    for txid in range(1, 8):
        store.start_transaction(txid, meta(txid), {0: part(txid, 0)})
        store.advance(txid)
    store.start_transaction(8, meta(8), {0: part(8, 0)})
    state = store.read_state()
    # The runner sees what it always did: currtx - 1 and the started txids.
    assert (state.currtx, dict(state.metas)) == (8, {7: meta(7), 8: meta(8)})
    assert set(state.partitions) == {7, 8}
    assert state.kept == (4, 5, 6) and state.rewinding is None
    assert backend.open().read_state() == state


def test_a_rewind_is_recorded_then_moves_currtx_back_and_forgets_later_txids(
    backend: Backend,
) -> None:
    store = leader(backend, history=3)
    for txid in range(1, 6):
        store.start_transaction(txid, meta(txid), {0: part(txid, 0)})
        store.advance(txid)
    store.start_transaction(6, meta(6), {0: part(6, 0)})
    store.record_digest(6, {"n": 1})
    store.start_transaction(7, meta(7), {})
    store.record_group(6, 7)
    with pytest.raises(
        ConfigurationError, match=r"no longer keeps its metadata \(it keeps txids 2..5"
    ):
        store.begin_rewind(1)
    with pytest.raises(ConfigurationError, match="the last committed txid is 5"):
        store.begin_rewind(6)
    with pytest.raises(CoordinatorError, match="records none"):
        store.finish_rewind(3)
    store.begin_rewind(3)
    assert store.read_state().rewinding == 3
    assert backend.open().read_state().rewinding == 3  # durable: no run starts now
    with pytest.raises(ConfigurationError, match="being rewound to txid 3: finish that rewind"):
        store.begin_rewind(4)
    with pytest.raises(CoordinatorError, match="one to txid 3"):
        store.finish_rewind(4)
    store.begin_rewind(3)  # the same rewind again (a rerun after a crash): nothing changes
    store.finish_rewind(3)
    expected = StoredState(
        currtx=4,
        metas={3: meta(3)},
        partitions={3: {0: part(3, 0)}},
        kept=(2,),
        group=None,
        rewinding=None,
    )
    assert store.read_state() == expected
    assert backend.open().read_state() == expected
    # The topology goes on from there: txid 4 starts anew, with other metadata.
    store.start_transaction(4, meta(40), {})
    store.advance(4)
    assert store.read_state().metas == {4: meta(40)} and store.read_state().kept == (2, 3)
    # To the beginning: nothing is kept, as for a new topology.
    store.begin_rewind(0)
    store.finish_rewind(0)
    assert store.read_state() == StoredState(currtx=1, metas={}, partitions={}, kept=())


def test_a_rewind_is_fenced(backend: Backend) -> None:
    old = leader(backend, history=3)
    for txid in (1, 2):
        old.start_transaction(txid, meta(txid), {})
        old.advance(txid)
    old.begin_rewind(1)
    backend.steal(old)
    new = leader(backend, history=3)
    with pytest.raises((FencedError, LostLeadershipError)):
        old.finish_rewind(1)
    assert new.read_state().rewinding == 1 and new.read_state().currtx == 3
    new.finish_rewind(1)
    assert new.read_state().currtx == 2


def test_retract_and_record_digest_are_fenced(backend: Backend) -> None:
    old = leader(backend)
    old.start_transaction(1, meta(1), {})
    old.start_transaction(2, meta(2), {})
    backend.steal(old)
    new = backend.open()
    new.acquire_leadership(timeout=10)
    before = new.read_state()
    with pytest.raises(LostLeadershipError):
        old.retract(1)
    with pytest.raises(LostLeadershipError):
        old.record_digest(2, {"0": [1, "1"]})
    with pytest.raises(LostLeadershipError):
        old.record_group(1, 2)
    assert new.read_state() == before
    new.retract(2)
    assert new.read_state() == StoredState(currtx=1, metas={1: meta(1)}, partitions={})


def rich_meta(txid: int) -> dict[str, object]:
    return {**meta(txid), "nested": {"keys": ["a", "é"], "x": [txid, 2.5, None, True]}}


def commit_with_history(
    store: StateStore, last: int, started: int
) -> dict[int, tuple[object, dict[int, object]]]:
    """Commit txids 1..``last`` one by one, then start the ones up to ``started``; what
    was written, txid -> (metadata, partition -> metadata): partition 0 at each start,
    partition 1 of each odd committed txid at its advance (as an opaque spout stores
    it), and txid 3's partition 0 replaced at its advance."""
    store.register(TopologyIdentity(spout="s.Spout", kind="opaque"))  # what a run does
    written: dict[int, tuple[object, dict[int, object]]] = {}
    for txid in range(1, started + 1):
        store.start_transaction(txid, rich_meta(txid), {0: part(txid, 0)})
        written[txid] = (rich_meta(txid), {0: part(txid, 0)})
        if txid > last:
            continue
        at_advance: dict[int, object] = {1: part(txid, 1)} if txid % 2 else {}
        if txid == 3:
            at_advance[0] = {"replaced": True}
        store.advance(txid, at_advance)
        written[txid][1].update(at_advance)
    return written


def test_read_history_reads_the_kept_txids_and_writes_nothing(backend: Backend) -> None:
    store = leader(backend, history=3)
    store.register(TopologyIdentity(spout="s.Spout", kind="opaque"))
    empty = backend.open_read_only()
    assert empty.read_history() == StoredHistory()  # nothing committed yet
    empty.close()
    written = commit_with_history(store, last=6, started=8)
    store.close()
    before = backend.snapshot()
    reader = backend.open_read_only()
    # advance(6) kept 6 - 3 = 3 and above; 6 itself is read_state's, not the history's.
    assert reader.read_history() == StoredHistory(
        metas={t: written[t][0] for t in (3, 4, 5)},
        partitions={t: written[t][1] for t in (3, 4, 5)},
    )
    assert reader.read_state().kept == (3, 4, 5)
    reader.close()
    assert backend.snapshot() == before


@pytest.mark.parametrize(("history", "kept"), [(3, [3, 4, 5]), (2, [4, 5]), (0, [])])
def test_status_lists_every_stored_txid_with_its_metadata(
    backend: Backend, history: int, kept: list[int]
) -> None:
    store = leader(backend, history=history)  # still leading: a look at a live topology
    written = commit_with_history(store, last=6, started=8)
    state, report, sinks = look(backend.where, TOPOLOGY, None)
    document = json.loads(json.dumps(status_document(TOPOLOGY, state, report, sinks)))
    assert document["rewind_targets"] == [0, *kept, 6]
    assert document["stored"] == {
        str(txid): {
            "committed": txid <= 6,
            "meta": written[txid][0],
            "partitions": {str(p): m for p, m in written[txid][1].items()},
        }
        for txid in [*kept, 6, 7, 8]
    }
    lines = status_lines(TOPOLOGY, state, report, sinks)
    summary = [line for line in lines if line.startswith("  kept for rewinds: ")]
    assert summary == (
        [
            f"  kept for rewinds: {len(kept)} committed txids ({kept[0]}..{kept[-1]}); "
            "`transactional status --json` shows the metadata of each"
        ]
        if kept
        else []
    )
    # Each txid from the last committed up has its lines; the kept ones only the summary.
    shown = [int(line.split()[1]) for line in lines if line.startswith("  txid ")]
    assert shown == [6, 7, 8]


def test_identity_is_stored_once_and_mismatch_refused(backend: Backend) -> None:
    identity = TopologyIdentity(spout="examples.tweets.TweetSpout", kind="transactional")
    store = leader(backend)
    store.register(identity)
    store.register(identity)
    store.start_transaction(1, meta(1), {})
    before = store.read_state()
    other = TopologyIdentity(spout="examples.tweets.TweetSpout", kind="opaque")
    with pytest.raises(ConfigurationError) as refused:
        backend.open().register(other)
    message = str(refused.value)
    assert (
        "'tweets' is registered for spout 'examples.tweets.TweetSpout' (transactional)" in message
    )
    assert "--topology-id" in message
    assert store.read_state() == before
    backend.open().register(identity)  # the stored identity did not change
    backend.open("another").register(other)  # topology ids are separate namespaces


def test_topology_ids_do_not_share_state(backend: Backend) -> None:
    first = leader(backend)
    second = backend.open("second")
    second.acquire_leadership(timeout=1)  # a different id is not locked by the first
    first.start_transaction(1, meta(1), {0: part(1, 0)})
    first.advance(1)
    second.start_transaction(1, META_2, {})
    assert first.read_state() == StoredState(
        currtx=2, metas={1: meta(1)}, partitions={1: {0: part(1, 0)}}
    )
    assert second.read_state() == StoredState(currtx=1, metas={1: META_2}, partitions={})


def test_second_runner_waits_for_the_first(backend: Backend) -> None:
    first = leader(backend)
    first.start_transaction(1, meta(1), {})
    second = backend.open()
    began = time.monotonic()
    with pytest.raises(LostLeadershipError, match="another runner holds topology 'tweets'"):
        second.acquire_leadership(timeout=0.5)
    assert time.monotonic() - began >= 0.5
    first.check_leadership()

    closer = threading.Timer(0.3, first.close)
    closer.start()
    second.acquire_leadership(timeout=10)  # blocks until the first lets go
    closer.join()
    second.check_leadership()
    with pytest.raises(LostLeadershipError):
        first.check_leadership()
    with pytest.raises(LostLeadershipError):
        first.advance(1)
    second.advance(1)
    assert second.read_state() == StoredState(currtx=2, metas={1: meta(1)}, partitions={})


def test_an_old_leader_is_fenced_after_a_takeover(backend: Backend) -> None:
    old = leader(backend)
    old.start_transaction(1, meta(1), {0: part(1, 0)})
    backend.steal(old)
    new = backend.open()
    new.acquire_leadership(timeout=10)
    with pytest.raises(LostLeadershipError):
        old.check_leadership()
    with pytest.raises(FencedError, match="another runner took over topology 'tweets'"):
        old.advance(1, {0: part(9, 0)})
    with pytest.raises(FencedError, match="another runner took over topology 'tweets'"):
        old.start_transaction(2, meta(2), {})
    state = StoredState(currtx=1, metas={1: meta(1)}, partitions={1: {0: part(1, 0)}})
    assert new.read_state() == state
    new.check_leadership()
    new.advance(1)
    assert new.read_state() == StoredState(
        currtx=2, metas={1: meta(1)}, partitions=state.partitions
    )


def test_writes_need_leadership(backend: Backend) -> None:
    store = backend.open()
    with pytest.raises(LostLeadershipError, match="call acquire_leadership first"):
        store.start_transaction(1, meta(1), {})
    with pytest.raises(LostLeadershipError):
        store.check_leadership()
    assert store.read_state() == EMPTY


def test_reopened_store_sees_persisted_state(backend: Backend) -> None:
    store = leader(backend)
    for txid in (1, 2, 3):
        store.start_transaction(txid, meta(txid), {0: part(txid, 0)})
    store.advance(1)
    store.advance(2, {0: part(7, 0)})
    store.close()
    expected = StoredState(
        currtx=3,
        metas={2: meta(2), 3: meta(3)},
        partitions={2: {0: part(7, 0)}, 3: {0: part(3, 0)}},
    )
    again = leader(backend)
    assert again.read_state() == expected
    again.advance(3)
    assert again.read_state() == StoredState(
        currtx=4, metas={3: meta(3)}, partitions={3: {0: part(3, 0)}}
    )


def test_close_is_idempotent(backend: Backend) -> None:
    store = leader(backend)
    store.close()
    store.close()
    leader(backend).check_leadership()


# --- ZooKeeper only ---------------------------------------------------------------------


def zk(hosts: str) -> KazooClient:
    client = KazooClient(hosts=hosts)
    client.start(timeout=15)
    return client


def znodes(hosts: str) -> dict[str, tuple[bytes, int, int, int]]:
    """Every node under the chroot of ``hosts``: its data, version, child version and
    last change (zxid)."""
    client = zk(hosts)
    try:
        found: dict[str, tuple[bytes, int, int, int]] = {}
        todo = ["/"]
        while todo:
            path = todo.pop()
            data, stat = client.get(path)
            found[path] = (data, stat.version, stat.cversion, stat.mzxid)
            todo += [f"{path.rstrip('/')}/{child}" for child in client.get_children(path)]
        return found
    finally:
        client.stop()
        client.close()


def test_zookeeper_layout(zk_hosts: str) -> None:
    store = ZooKeeperStateStore(zk_hosts)
    store.open(TOPOLOGY)
    try:
        store.register(TopologyIdentity(spout="s.Spout", kind="partitioned"))
        store.acquire_leadership(timeout=10)
        store.start_transaction(1, meta(1), {0: part(1, 0), 1: part(1, 1)})
        store.start_transaction(2, meta(2), {0: part(2, 0), 1: part(2, 1)})
        store.start_transaction(3, meta(3), {0: part(3, 0), 1: part(3, 1)})
        store.advance(1)
        store.advance(2)
        client = zk(zk_hosts)
        try:
            root = "/transactional/tweets"
            assert client.get_children("/") == ["transactional"]
            assert client.get_children("/transactional") == ["tweets"]
            assert sorted(client.get_children(root)) == [
                "coordinator",
                "identity",
                "leader",
                "partition",
            ]
            assert sorted(client.get_children(f"{root}/coordinator")) == [
                "currtx",
                "digest",
                "group",
                "meta",
                "rewind",
            ]
            assert client.get(f"{root}/coordinator/group")[0] == b""  # none recorded
            assert client.get(f"{root}/coordinator/rewind")[0] == b""  # none begun
            assert sorted(client.get_children(f"{root}/coordinator/meta")) == [
                "00000000000000000001",  # committed, kept for rewinds (history)
                "00000000000000000002",
                "00000000000000000003",
            ]
            assert sorted(client.get_children(f"{root}/partition")) == ["0", "1"]
            for p in (0, 1):
                path = f"{root}/partition/{p}"
                assert sorted(client.get_children(path)) == [
                    "00000000000000000001",
                    "00000000000000000002",
                    "00000000000000000003",
                ]
                data, _stat = client.get(f"{path}/00000000000000000003")
                assert json.loads(data) == part(3, p)
            assert json.loads(client.get(f"{root}/coordinator/currtx")[0]) == 3
            assert json.loads(client.get(f"{root}/coordinator/meta/00000000000000000002")[0]) == (
                meta(2)
            )
            assert json.loads(client.get(f"{root}/identity")[0]) == {
                "kind": "partitioned",
                "spout": "s.Spout",
            }
            data, stat = client.get(f"{root}/leader")
            assert data.decode() == store.runner_id
            assert stat.ephemeralOwner == store._client.client_id[0]
            store.close()
            assert client.exists(f"{root}/leader") is None
            assert json.loads(client.get(f"{root}/coordinator/currtx")[0]) == 3
        finally:
            client.stop()
            client.close()
    finally:
        store.close()


def test_zookeeper_session_expiry_loses_leadership(zk_hosts: str) -> None:
    store = ZooKeeperStateStore(zk_hosts, session_timeout=4.0)
    store.open(TOPOLOGY)
    try:
        store.acquire_leadership(timeout=10)
        store.start_transaction(1, meta(1), {})
        store.check_leadership()
        expire_session(zk_hosts, store, wait_reconnect=False)
        with pytest.raises(LostLeadershipError):
            store.check_leadership()
        client = zk(zk_hosts)
        try:
            assert client.exists(f"/transactional/{TOPOLOGY}/leader") is None
        finally:
            client.stop()
            client.close()
        # Once kazoo has a new session, the listener's verdict still stands.
        deadline = time.monotonic() + 15
        while store._client.client_id is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store._client.state == "CONNECTED"
        with pytest.raises(LostLeadershipError, match="session of this runner is lost"):
            store.check_leadership()
        store.acquire_leadership(timeout=10)  # a new session may lead again
        store.check_leadership()
        store.advance(1)
        assert store.read_state() == StoredState(currtx=2, metas={1: meta(1)}, partitions={})
    finally:
        store.close()


def test_zookeeper_unreachable_names_the_hosts() -> None:
    hosts = f"127.0.0.1:{free_port()}"
    store = ZooKeeperStateStore(hosts, connect_timeout=1.0)
    with pytest.raises(StoreUnavailableError, match=f"cannot connect to ZooKeeper at {hosts}"):
        store.open(TOPOLOGY)
    store.close()


# --- SQLite only ------------------------------------------------------------------------


def test_sqlite_file_lock_and_wal(tmp_path: Path) -> None:
    db = tmp_path / "a" / "b" / "state.db"
    store = SQLiteStateStore(db)
    store.open("my/topology")
    try:
        store.acquire_leadership(timeout=1)
        assert store.lock_path == tmp_path / "a" / "b" / "state.db.my%2Ftopology.lock"
        assert store.lock_path.read_text().startswith("pid ")
        conn = sqlite3.connect(db)
        try:
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            assert {"topology_identity", "currtx", "coordinator_meta", "partition_meta"} <= tables
        finally:
            conn.close()
        other = SQLiteStateStore(db)
        other.open("my/topology")
        with pytest.raises(LostLeadershipError, match=str(store.lock_path)):
            other.acquire_leadership(timeout=0.2)
        other.close()
    finally:
        store.close()


def test_sqlite_unusable_path_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(StoreUnavailableError, match="cannot open the SQLite state store"):
        SQLiteStateStore(tmp_path / "dir.db").open(TOPOLOGY)
