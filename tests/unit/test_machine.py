"""The state machine, one readable schedule a test: events in, exact commands out.

No Spark, no thread, no sleep: time is a number given with each event. Each test is a
step of docs/architecture.md, "The protocol" (or of the runtime's additions: idle
polls, empty batches, lost leadership), written as the schedule a runner would meet.
"""

from __future__ import annotations

import itertools

import pytest

from transactional.config import RunnerConfig
from transactional.errors import (
    AttemptTimeoutError,
    ContractError,
    FencedError,
    LostLeadershipError,
)
from transactional.runtime.machine import Machine
from transactional.runtime.messages import (
    Acknowledge,
    Advance,
    Advanced,
    Backoff,
    Cancel,
    Commit,
    CommitBegan,
    Committed,
    Emit,
    Failed,
    Halt,
    HaltReason,
    LeadershipLost,
    NotReady,
    Opened,
    Phase,
    Processed,
    Reacquire,
    Replay,
    Retract,
    Retracted,
    Started,
    StopRequested,
    Tick,
    Verified,
    Verify,
)
from transactional.runtime.state import InvariantError, SlotState
from transactional.types import TransactionAttempt as A

SETTINGS = RunnerConfig(
    topology_id="machine",
    max_pending=3,
    max_attempts=3,
    attempt_timeout_s=10.0,
    backoff_initial_s=1.0,
    backoff_max_s=4.0,
    poll_interval_s=1.0,
    poll_max_s=4.0,
    max_reelections=1,
)


def process(machine: Machine, attempt: A, now: float = 0.0, records: int = 5) -> list[object]:
    out = machine.step(Processed(attempt, records, empty=False), now)
    assert out == [Verify(attempt)]
    return list(machine.step(Verified(attempt), now))


def test_the_window_fills_one_start_at_a_time_and_commits_only_currtx() -> None:
    machine = Machine(SETTINGS)
    assert machine.step(Opened(1, frozenset()), 0.0) == [Emit(A(1, 1), 1)]
    assert machine.step(Started(A(1, 1)), 0.0) == [Emit(A(2, 2), 1)]
    assert machine.step(Started(A(2, 2)), 0.0) == [Emit(A(3, 3), 1)]
    assert machine.step(Started(A(3, 3)), 0.0) == []  # max_pending=3: the window is full
    # txid 2 is processed first: it waits, as txid 1 has not committed.
    assert process(machine, A(2, 2)) == []
    assert process(machine, A(1, 1)) == [Commit(A(1, 1), 1)]
    assert process(machine, A(3, 3)) == []  # one commit at a time
    assert machine.step(CommitBegan(A(1, 1)), 1.0) == []
    assert machine.step(Committed(A(1, 1)), 2.0) == [Advance(A(1, 1), 1)]
    # Advanced: txid 1 acknowledged, txid 4 may start, and txid 2 commits.
    assert machine.step(Advanced(A(1, 1)), 2.0) == [
        Acknowledge(A(1, 1), 1, 5, queued_s=0.0),
        Emit(A(4, 4), 1),
    ]
    assert machine.step(NotReady(4), 2.0) == [Commit(A(2, 2), 1)]
    assert machine.currtx == 2 and machine.counts.committed_txids == 1


def test_a_failure_drops_the_txid_and_every_one_above_then_replays_them_after_a_backoff() -> None:
    machine = Machine(SETTINGS)
    machine.step(Opened(1, frozenset()), 0.0)
    for txid in (1, 2, 3):
        machine.step(Started(A(txid, txid)), 0.0)
    error = RuntimeError("executor lost")
    out = machine.step(Failed(A(2, 2), error, Phase.PROCESS), 5.0)
    assert out == [
        Cancel(A(2, 2), failed=True),
        Cancel(A(3, 3), failed=True),
        Backoff(2, error, Phase.PROCESS, failures=1, retry_at=6.0),
    ]
    assert machine.step(Tick(), 5.5) == []  # backing off
    # Stored metadata: replayed with new attempt ids, never decided again.
    assert machine.step(Tick(), 6.0) == [Replay(A(2, 4), 2)]
    assert machine.step(Started(A(2, 4)), 6.0) == [Replay(A(3, 5), 2)]
    assert machine.step(Started(A(3, 5)), 6.0) == []
    # The dropped attempt's late result is stale: ignored, and counted.
    assert machine.step(Processed(A(2, 2), 5, empty=False), 6.0) == []
    assert machine.counts.stale_ignored == 1 and machine.counts.failures == 1


def test_a_txid_that_fails_max_attempts_times_halts_as_a_poison_batch() -> None:
    machine = Machine(SETTINGS.model_copy(update={"max_pending": 1}))
    machine.step(Opened(1, frozenset()), 0.0)
    now, attempt = 0.0, A(1, 1)
    for failures in (1, 2):
        machine.step(Started(attempt), now)
        out = machine.step(Failed(attempt, ValueError("bad row"), Phase.PROCESS), now)
        assert isinstance(out[-1], Backoff) and out[-1].failures == failures
        now = out[-1].retry_at
        (replay,) = machine.step(Tick(), now)
        assert isinstance(replay, Replay) and replay.number == failures + 1
        attempt = replay.attempt
    machine.step(Started(attempt), now)
    error = ValueError("bad row")
    assert machine.step(Failed(attempt, error, Phase.PROCESS), now) == [
        Cancel(attempt, failed=True),
        Halt(HaltReason.POISON, error, 1, Phase.PROCESS, 3),
    ]


def test_a_contract_error_halts_at_its_first_occurrence() -> None:
    machine = Machine(SETTINGS)
    machine.step(Opened(1, frozenset()), 0.0)
    error = ContractError("bolt 'count' returned None")
    assert machine.step(Failed(A(1, 1), error, Phase.START), 0.0) == [
        Halt(HaltReason.CONFIGURATION, error, 1, Phase.START, 1)
    ]


def test_a_start_that_failed_after_storing_its_metadata_is_replayed() -> None:
    machine = Machine(SETTINGS)
    machine.step(Opened(1, frozenset()), 0.0)
    out = machine.step(Failed(A(1, 1), OSError("emit"), Phase.START, stored=True), 0.0)
    assert isinstance(out[-1], Backoff)
    assert machine.step(Tick(), out[-1].retry_at) == [Replay(A(1, 2), 2)]


def test_an_attempt_past_its_deadline_fails_and_a_commit_deadline_starts_when_it_begins() -> None:
    one = SETTINGS.model_copy(update={"max_pending": 1})
    machine = Machine(one)
    machine.step(Opened(1, frozenset()), 0.0)
    assert machine.step(Started(A(1, 1)), 0.0) == []
    assert machine.step(Tick(), 9.9) == []
    out = machine.step(Tick(), 10.0)
    assert [type(c) for c in out] == [Cancel, Backoff]
    assert isinstance(out[1], Backoff) and isinstance(out[1].error, AttemptTimeoutError)
    assert out[1].phase is Phase.PROCESS

    machine = Machine(one)
    machine.step(Opened(1, frozenset()), 0.0)
    machine.step(Started(A(1, 1)), 0.0)
    assert process(machine, A(1, 1), now=9.0) == [Commit(A(1, 1), 1)]
    # The commit thread takes it up only at 15 (behind a slow one): no deadline till then.
    assert machine.step(Tick(), 20.0) == []
    machine.step(CommitBegan(A(1, 1)), 15.0)
    assert machine.step(Tick(), 24.9) == []
    out = machine.step(Tick(), 25.0)
    assert isinstance(out[-1], Backoff) and out[-1].phase is Phase.COMMIT


def test_idle_polls_back_off_to_the_maximum_and_data_resets_the_interval() -> None:
    machine = Machine(SETTINGS)
    machine.step(Opened(1, frozenset()), 0.0)
    asked = [0.0]
    now = 0.0
    for _ in range(5):
        assert machine.step(NotReady(1), now) == []
        now = machine.poll_at
        (emit,) = machine.step(Tick(), now)
        assert isinstance(emit, Emit) and emit.attempt.txid == 1 and emit.number == 1
        asked.append(now)
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert gaps == [1.0, 2.0, 4.0, 4.0, 4.0]  # doubling up to poll_max_s
    assert machine.drained(now) is False  # a start is pending
    attempt = emit.attempt
    machine.step(Started(attempt), now)
    machine.step(NotReady(2), now)
    process(machine, attempt, now)
    assert machine.poll_interval == 1.0  # a batch with records resets it


def test_an_empty_batch_is_retracted_with_every_txid_above_it_and_polled_again() -> None:
    machine = Machine(SETTINGS)
    machine.step(Opened(1, frozenset()), 0.0)
    machine.step(Started(A(1, 1)), 0.0)
    machine.step(Started(A(2, 2)), 0.0)
    machine.step(NotReady(3), 0.0)  # polls again at 1.0
    assert machine.step(Processed(A(1, 1), 0, empty=True), 0.5) == [Verify(A(1, 1))]
    assert machine.step(Verified(A(1, 1)), 0.5) == [Retract(A(1, 1))]
    assert machine.step(Retracted(A(1, 1)), 0.5) == [
        Cancel(A(1, 1), failed=False),
        Cancel(A(2, 2), failed=False),
    ]
    assert machine.next_txid == 1 and not machine.stored and machine.counts.empty_polls == 1
    assert machine.drained(0.5)
    assert machine.step(Tick(), machine.poll_at) == [Emit(A(1, 4), 1)]  # decided again


def test_lost_leadership_drops_everything_and_replays_the_stored_txids_first() -> None:
    machine = Machine(SETTINGS)
    machine.step(Opened(1, frozenset()), 0.0)
    machine.step(Started(A(1, 1)), 0.0)
    machine.step(Started(A(2, 2)), 0.0)
    machine.step(NotReady(3), 0.0)
    lost = LostLeadershipError("session expired")
    assert machine.step(LeadershipLost(lost), 0.0) == [
        Cancel(A(1, 1), failed=True),
        Cancel(A(2, 2), failed=True),
        Reacquire(lost),
    ]
    assert machine.step(Tick(), 1.0) == []  # nothing starts without the leadership
    assert machine.step(Opened(1, frozenset({1, 2})), 1.0) == [Replay(A(1, 4), 2)]
    assert machine.step(Started(A(1, 4)), 1.0) == [Replay(A(2, 5), 2)]
    assert machine.step(Started(A(2, 5)), 1.0) == [Emit(A(3, 6), 1)]
    assert machine.counts.reelections == 1


def test_a_lost_leadership_reported_as_a_failure_is_no_failure_of_the_txid() -> None:
    machine = Machine(SETTINGS)
    machine.step(Opened(1, frozenset()), 0.0)
    machine.step(Started(A(1, 1)), 0.0)
    machine.step(NotReady(2), 0.0)
    lost = LostLeadershipError("fenced write")
    out = machine.step(Failed(A(1, 1), lost, Phase.ADVANCE), 0.0)
    assert out == [Cancel(A(1, 1), failed=True), Reacquire(lost)]
    assert machine.counts.failures == 0 and machine.failures[1] == 0


def test_a_deposed_runner_and_one_that_lost_leadership_too_often_halt() -> None:
    machine = Machine(SETTINGS)
    machine.step(Opened(1, frozenset()), 0.0)
    machine.step(NotReady(1), 0.0)
    fenced = FencedError("a newer leader")
    assert machine.step(LeadershipLost(fenced), 0.0) == [Halt(HaltReason.DEPOSED, fenced)]

    machine = Machine(SETTINGS)  # max_reelections=1
    machine.step(Opened(1, frozenset()), 0.0)
    machine.step(NotReady(1), 0.0)
    lost = LostLeadershipError("expired")
    assert machine.step(LeadershipLost(lost), 0.0) == [Reacquire(lost)]
    machine.step(Opened(1, frozenset()), 0.0)
    machine.step(NotReady(1), 0.0)
    assert machine.step(LeadershipLost(lost), 0.0) == [Halt(HaltReason.REELECTIONS, lost)]


def test_a_stop_starts_nothing_and_commits_nothing_more() -> None:
    machine = Machine(SETTINGS)
    machine.step(Opened(1, frozenset()), 0.0)
    machine.step(Started(A(1, 1)), 0.0)
    machine.step(Started(A(2, 2)), 0.0)
    machine.step(NotReady(3), 0.0)
    assert machine.step(StopRequested(), 0.0) == []
    assert process(machine, A(1, 1)) == []  # processed, but not committed
    assert machine.slots[1].state is SlotState.PROCESSED
    assert machine.step(Tick(), 5.0) == []  # and txid 3 is not asked for again


def test_an_advance_of_a_txid_that_is_not_committing_is_a_bug() -> None:
    machine = Machine(SETTINGS)
    machine.step(Opened(1, frozenset()), 0.0)
    machine.step(Started(A(1, 1)), 0.0)
    with pytest.raises(InvariantError):
        machine.step(Advanced(A(1, 1)), 0.0)


def test_an_event_before_a_start_is_answered_is_a_bug() -> None:
    machine = Machine(SETTINGS)
    machine.step(Opened(1, frozenset()), 0.0)  # Emit(1) asked for
    with pytest.raises(InvariantError, match="unanswered"):
        machine.step(Tick(), 0.0)


# ---------------------------------------------------------------------- commit groups


def grouped(machine: Machine, attempt: A, now: float = 0.0, records: int = 5) -> list[object]:
    """``process`` for an attempt every committer may commit in a group."""
    out = machine.step(Processed(attempt, records, empty=False, groupable=True), now)
    assert out == [Verify(attempt)]
    return list(machine.step(Verified(attempt), now))


def running(machine: Machine, txids: int) -> None:
    """Opened at txid 1 (no recorded group: txid 1 is pinned alone), txid 1 committed
    and advanced, txids 2..``txids`` started."""
    machine.step(Opened(1, frozenset()), 0.0)
    for t in range(1, txids + 1):
        machine.step(Started(A(t, t)), 0.0)
    assert grouped(machine, A(1, 1)) == [Commit(A(1, 1), 1)]
    machine.step(Committed(A(1, 1)), 0.0)
    out = machine.step(Advanced(A(1, 1)), 0.0)
    assert Acknowledge(A(1, 1), 1, 5, queued_s=0.0) in out
    for command in out:
        if isinstance(command, Emit):  # the window moved: nothing new this time
            assert machine.step(NotReady(command.attempt.txid), 0.0) == []


def test_processed_txids_behind_a_commit_go_as_one_group_of_at_most_max_group() -> None:
    machine = Machine(SETTINGS.model_copy(update={"max_pending": 5, "max_group": 3}))
    running(machine, 5)  # the window [2, 7): 6 was asked for, and is not ready
    for t in (3, 4, 5):
        assert grouped(machine, A(t, t)) == []  # txid 2 is not processed
    # txid 2 done: 2, 3 and 4 go together (max_group=3); 5 waits for the next commit.
    assert grouped(machine, A(2, 2)) == [Commit(A(2, 2), 1, ((A(3, 3), 1), (A(4, 4), 1)))]
    assert machine.pinned == (2, 4)
    assert machine.step(Committed(A(2, 2)), 1.0) == [Advance(A(2, 2), 4)]
    out = machine.step(Advanced(A(2, 2)), 1.0)
    assert out[:3] == [Acknowledge(A(t, t), 1, 5, queued_s=0.0) for t in (2, 3, 4)]
    assert out[3:] == [Emit(A(6, 7), 1)]  # the window moved to [5, 10)
    assert machine.currtx == 5 and machine.pinned is None
    assert machine.counts.committed_txids == 4 and machine.counts.grouped_commits == 1


def test_a_txid_a_committer_will_not_group_ends_the_group_before_it() -> None:
    machine = Machine(SETTINGS.model_copy(update={"max_pending": 4}))
    running(machine, 4)
    assert process(machine, A(3, 3)) == []  # not groupable (``Committer.groupable``)
    assert grouped(machine, A(4, 4)) == []
    assert grouped(machine, A(2, 2)) == [Commit(A(2, 2), 1)]
    machine.step(Committed(A(2, 2)), 0.0)
    assert machine.step(Advanced(A(2, 2)), 0.0)[-1] == Commit(A(3, 3), 1)  # alone


def test_a_failed_group_is_committed_again_exactly_whatever_is_processed_by_then() -> None:
    machine = Machine(SETTINGS.model_copy(update={"max_pending": 4}))
    running(machine, 4)
    for t in (3, 2):
        grouped(machine, A(t, t))
    # 2 and 3 went as a group; 4 is processed meanwhile.
    assert grouped(machine, A(4, 4)) == []
    out = machine.step(Failed(A(2, 2), RuntimeError("lost reply"), Phase.COMMIT), 1.0)
    assert [c for c in out if isinstance(c, Cancel)] == [Cancel(A(t, t), True) for t in (2, 3, 4)]
    assert machine.pinned == (2, 3)
    # Back after the back-off: 2, 3 and 4 replayed and processed; the group is 2..3.
    assert machine.step(Tick(), 2.0) == [Replay(A(2, 6), 2)]
    assert machine.step(Started(A(2, 6)), 2.0) == [Replay(A(3, 7), 2)]
    assert machine.step(Started(A(3, 7)), 2.0) == [Replay(A(4, 8), 2)]
    assert machine.step(Started(A(4, 8)), 2.0) == [Emit(A(5, 9), 1)]
    assert machine.step(NotReady(5), 2.0) == []
    assert grouped(machine, A(4, 8), 2.0) == []
    assert grouped(machine, A(2, 6), 2.0) == []  # waits for all of the pinned group
    assert grouped(machine, A(3, 7), 2.0) == [Commit(A(2, 6), 2, ((A(3, 7), 2),))]


def test_a_recorded_group_is_replayed_whole_even_past_max_pending_and_an_empty_txid_stays_in_it() -> (
    None
):
    machine = Machine(SETTINGS.model_copy(update={"max_pending": 1, "max_group": 1}))
    out = machine.step(Opened(4, frozenset({4, 5, 6}), group=(4, 6)), 0.0)
    assert out == [Replay(A(4, 1), 1)]
    assert machine.step(Started(A(4, 1)), 0.0) == [Replay(A(5, 2), 1)]  # window: 3
    assert machine.step(Started(A(5, 2)), 0.0) == [Replay(A(6, 3), 1)]
    assert machine.step(Started(A(6, 3)), 0.0) == []
    assert process(machine, A(4, 1)) == []  # not groupable: the recorded group rules
    # txid 5 came out empty this time: committed in its group, not retracted.
    assert machine.step(Processed(A(5, 2), 0, empty=True), 0.0) == [Verify(A(5, 2))]
    assert machine.step(Verified(A(5, 2)), 0.0) == []
    assert process(machine, A(6, 3)) == [Commit(A(4, 1), 1, ((A(5, 2), 1), (A(6, 3), 1)))]
    machine.step(Committed(A(4, 1)), 0.0)
    machine.step(Advanced(A(4, 1)), 0.0)
    assert machine.currtx == 7 and machine.window() == 1


def test_after_opened_without_a_recorded_group_currtx_is_committed_alone() -> None:
    # An earlier run may have committed txid 2 alone (no record): grouping it now with 3
    # would put the sink's marker inside the group.
    machine = Machine(SETTINGS)
    machine.step(Opened(2, frozenset({2, 3}), group=(1, 2)), 0.0)  # a stale record
    assert machine.pinned == (2, 2)
    machine.step(Started(A(2, 1)), 0.0)
    assert machine.step(Started(A(3, 2)), 0.0) == [Emit(A(4, 3), 1)]
    assert machine.step(NotReady(4), 0.0) == []
    assert grouped(machine, A(3, 2)) == []
    assert grouped(machine, A(2, 1)) == [Commit(A(2, 1), 1)]


def test_group_wait_holds_a_processed_txid_for_the_ones_still_processing_up_to_its_limit() -> None:
    settings = SETTINGS.model_copy(
        update={"max_pending": 3, "group_wait_s": 5.0, "poll_interval_s": 99, "poll_max_s": 99}
    )
    machine = Machine(settings)
    running(machine, 3)  # 2 and 3 in flight; 4 not ready (asked again at t=99)
    assert grouped(machine, A(2, 2), now=1.0) == []  # 3 is still processing: wait
    assert machine.wait_time(1.0) <= 1.0
    assert grouped(machine, A(3, 3), now=2.0) == [Commit(A(2, 2), 1, ((A(3, 3), 1),))]
    machine.step(Committed(A(2, 2)), 2.0)
    machine.step(Advanced(A(2, 2)), 2.0)
    machine.poll_at = 2.0  # data came: 4 and 5 start
    assert machine.step(Tick(), 2.0) == [Emit(A(4, 5), 1)]
    assert machine.step(Started(A(4, 5)), 2.0) == [Emit(A(5, 6), 1)]
    assert machine.step(Started(A(5, 6)), 2.0) == [Emit(A(6, 7), 1)]
    machine.step(NotReady(6), 2.0)
    assert grouped(machine, A(4, 5), now=3.0) == []  # 5 is still processing...
    assert machine.step(Tick(), 7.9) == []
    assert machine.step(Tick(), 8.0) == [Commit(A(4, 5), 1)]  # ...for 5 s at most


def test_a_processed_txid_waiting_for_its_pinned_group_waits_for_the_retry_not_in_ticks() -> None:
    """The group (2, 3) recorded by an earlier run is committed exactly again: txid 2,
    processed, waits for txid 3, whose replay failed and is retried after a back-off.
    The coordinator sleeps until that retry, instead of waking every millisecond."""
    machine = Machine(SETTINGS)
    assert machine.step(Opened(2, frozenset({2, 3}), (2, 3)), 0.0) == [Replay(A(2, 1), 1)]
    assert machine.step(Started(A(2, 1)), 0.0) == [Replay(A(3, 2), 1)]
    out = machine.step(Failed(A(3, 2), RuntimeError("replay"), Phase.START), 0.0)
    assert [type(c) for c in out] == [Backoff] and machine.retry_at == 1.0
    assert grouped(machine, A(2, 1), now=0.2) == []  # its group is not whole
    assert machine.wait_time(0.2) == pytest.approx(0.8)
    (replay,) = machine.step(Tick(), 1.0)
    assert replay == Replay(A(3, 3), 2)
