"""Step 7 of the runner (lost leadership) and commits whose outcome is unknown, on the
in-memory doubles. Every test ends with the sink checked against ``Counter(records)``."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from transactional.committer import CommitterContext
from transactional.config import RunnerConfig
from transactional.errors import (
    CommitError,
    FencedError,
    LostLeadershipError,
    StoreUnavailableError,
)
from transactional.runner import TransactionalRunner
from transactional.testing import (
    InMemoryEngine,
    InMemoryStateStore,
    ListOpaqueSpout,
    ListTransactionalSpout,
    MemoryCommitter,
    counting_topology,
)
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

RECORDS = [f"r{i % 7}" for i in range(50)]  # 5 txids of 10
EXPECTED = dict(Counter(RECORDS))


class SessionStore(InMemoryStateStore):
    """Loses leadership the way a ZooKeeper session does: ``check_leadership`` raises a
    plain ``LostLeadershipError`` before the commits of ``lose_at``, and the next
    ``acquire_leadership`` calls do what ``reacquire`` says (None: succeed)."""

    def __init__(self, lose_at: tuple[int, ...] = (), reacquire: list[Exception] | None = None):
        super().__init__()
        self.lose_at = set(lose_at)
        self.reacquire = reacquire or []
        self.epoch = 0
        self.acquisitions = 0

    def acquire_leadership(self, timeout: float | None = None) -> None:
        self.acquisitions += 1
        if self.acquisitions > 1 and self.reacquire:
            raise self.reacquire.pop(0)
        self.epoch += 1
        super().acquire_leadership(timeout)

    def check_leadership(self) -> None:
        if self.currtx in self.lose_at:
            self.lose_at.discard(self.currtx)
            self.leader = False
            raise LostLeadershipError("the session expired")
        super().check_leadership()

    def fence_token(self) -> int | None:
        return self.epoch if self.leader else None


class RecordingCommitter(MemoryCommitter):
    """Records the fence token each commit carried; ``fail(attempt)`` returns the
    exception to raise, ``after_write`` says whether the write happened first."""

    def __init__(
        self,
        mode: CommitMode = CommitMode.TRANSACTIONAL,
        raises: dict[int, Exception] | None = None,
        after_write: bool = False,
    ) -> None:
        super().__init__(mode)
        self.raises = dict(raises or {})
        self.after_write = after_write
        self.tokens: list[tuple[int, int | None]] = []
        self.attempts: list[int] = []

    def open(self, context: CommitterContext) -> None:
        self.context = context

    def commit(self, attempt: TransactionAttempt, prepared: Counter[Any]) -> CommitOutcome:
        self.attempts.append(attempt.txid)
        self.tokens.append((attempt.txid, self.context.fence_token))
        error = self.raises.pop(attempt.txid, None)
        if error is not None and not self.after_write:
            raise error
        outcome = super().commit(attempt, prepared)
        if error is not None:
            raise error
        return outcome


def run(
    store: InMemoryStateStore, committer: MemoryCommitter, spout: Any = None, **config: Any
) -> tuple[TransactionalRunner, Any]:
    topology = counting_topology(spout or ListTransactionalSpout(RECORDS, 10), committer)
    settings: dict[str, Any] = {
        "topology_id": "t",
        "max_pending": 3,
        "max_group": 1,  # each txid alone: these tests follow single commits
        "backoff_initial_s": 0.0,
        "backoff_max_s": 0.0,
        "poll_interval_s": 0.01,
        "leader_timeout_s": 5.0,
        **config,
    }
    runner = TransactionalRunner(
        topology, store, config=RunnerConfig(**settings), engine=InMemoryEngine()
    )
    return runner, runner.run(until_drained=True)


def test_a_lost_session_is_taken_back_and_in_flight_work_is_redone_under_a_new_token() -> None:
    store = SessionStore(lose_at=(3,))
    committer = RecordingCommitter()
    spout = ListTransactionalSpout(RECORDS, 10)
    _, stats = run(store, committer, spout)

    assert committer.counts == EXPECTED
    assert store.advances == [1, 2, 3, 4, 5]
    assert stats.reelections == 1 and stats.failures == 0
    assert store.acquisitions == 2
    # Nothing was committed while leadership was in doubt; later commits carry token 2.
    assert committer.tokens == [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]
    assert 3 in spout.failed  # the dropped txids were reported to the spout
    assert len([a for a, _ in spout.emits if a.txid == 3]) == 2  # re-emitted once
    assert [t for t, _ in spout.init_calls] == [1, 2, 3, 4, 5]  # metadata decided once


def test_an_unreachable_store_is_retried_until_it_is_back() -> None:
    down = [StoreUnavailableError("connection refused"), StoreUnavailableError("again")]
    store = SessionStore(lose_at=(2,), reacquire=down)
    committer = RecordingCommitter()
    _, stats = run(store, committer)
    assert committer.counts == EXPECTED
    assert store.advances == [1, 2, 3, 4, 5]
    assert stats.reelections == 1 and store.acquisitions == 4


def test_an_unreachable_store_past_leader_timeout_stops_the_run() -> None:
    down = [StoreUnavailableError("connection refused")] * 1000
    store = SessionStore(lose_at=(2,), reacquire=down)
    committer = RecordingCommitter()
    with pytest.raises(LostLeadershipError, match=r"could not get the leadership .* back"):
        run(store, committer, leader_timeout_s=0.3)
    assert store.currtx == 2 and committer.committed_sequence() == [1]
    store.reacquire = []
    _, stats = run(store, committer)  # a later start resumes exactly
    assert committer.counts == EXPECTED and stats.committed_txids == 4


def test_another_runner_leading_after_the_loss_stops_this_one() -> None:
    held = [LostLeadershipError("another runner holds topology 't'")]
    store = SessionStore(lose_at=(3,), reacquire=held)
    committer = RecordingCommitter()
    with pytest.raises(LostLeadershipError, match="another runner leads topology 't' now"):
        run(store, committer)
    assert store.currtx == 3 and committer.committed_sequence() == [1, 2]


def test_a_fenced_commit_stops_at_once_without_taking_leadership_back() -> None:
    store = SessionStore()
    committer = RecordingCommitter(raises={3: FencedError("sink holds fence 9")})
    with pytest.raises(FencedError, match="sink holds fence 9"):
        run(store, committer)
    assert store.acquisitions == 1 and store.currtx == 3
    assert committer.committed_sequence() == [1, 2]


def test_re_elections_are_bounded() -> None:
    store = SessionStore(lose_at=(2,))
    original = store.check_leadership

    def always_lost() -> None:
        if store.currtx == 2:
            raise LostLeadershipError("the session expired")
        original()

    store.check_leadership = always_lost  # type: ignore[method-assign]
    with pytest.raises(LostLeadershipError, match="max_reelections=2"):
        run(store, RecordingCommitter(), max_reelections=2)
    assert store.acquisitions == 3 and store.currtx == 2


def test_a_commit_that_raised_after_writing_is_resolved_by_the_sinks_txid() -> None:
    lost_reply = CommitError("Timeout reading from socket")
    committer = RecordingCommitter(raises={2: lost_reply}, after_write=True)
    store = SessionStore()
    _, stats = run(store, committer)
    assert committer.counts == EXPECTED
    assert committer.attempts == [1, 2, 3, 4, 5]  # txid 2 was not committed again
    assert stats.resolved_commits == 1 and stats.failures == 0
    assert stats.outcomes == Counter({"applied": 4, "skipped": 1})


def test_a_commit_that_raised_before_writing_is_replayed() -> None:
    committer = RecordingCommitter(raises={2: CommitError("Connection refused")})
    store = SessionStore()
    _, stats = run(store, committer)
    assert committer.counts == EXPECTED
    assert committer.attempts == [1, 2, 2, 3, 4, 5]
    assert stats.resolved_commits == 0 and stats.failures == 1


def test_an_opaque_spouts_commit_is_never_resolved_by_txid_only_redone() -> None:
    # A replay of an opaque spout may differ; here the first emission of txid 2 lost a
    # record, so only committing the replay's own rows again is exact.
    def source(attempt: TransactionAttempt, partition: int, rows: list[Any]) -> list[Any]:
        return rows[1:] if attempt.txid == 2 and attempt.attempt_id <= 3 else rows

    committer = RecordingCommitter(
        CommitMode.OPAQUE, raises={2: CommitError("Timeout reading from socket")}, after_write=True
    )
    spout = ListOpaqueSpout([RECORDS], 10, source)
    _, stats = run(SessionStore(), committer, spout)
    assert committer.counts == EXPECTED
    assert committer.attempts.count(2) == 2 and stats.resolved_commits == 0
