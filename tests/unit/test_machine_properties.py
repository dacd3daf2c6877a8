"""The state machine under random schedules (hypothesis): no Spark, no thread, no sleep.

A small world answers the machine's commands the way the executor would: starts,
verifications, advances and retractions at once; processing and commits later, in an
order hypothesis picks, with failures, timeouts, lost leadership, a deposed leader's
write refused, new data arriving while the source was idle, and crashes after which a
new machine resumes from the store. The world's store and sink check the protocol as it
happens (metadata written once, commits in txid order with no gap); at the end the sink
holds every record of the source that was decided, exactly once.

Under ``at_least_once`` the sink applies every commit it is given (no last-txid check)
and keeps its marker at the last txid of an unbroken run from the first (commits may
overlap and finish out of order): at the end it holds every record at least once, and a
record more than once only because its txid was applied and then replayed (no attempt
is ever applied twice).

Under ``at_most_once`` the same world drops a failed txid instead of retrying it, moves
the store past what was in flight at a crash (as ``runtime.settle`` does), and at the end
the sink holds every decided record at most once, and misses exactly the records of the
txids the machine reported dropped.

The machine itself asserts its invariants after every step (``InvariantError``). A
failing example shrinks to a short schedule, printed one step a line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, note, settings
from hypothesis import event as label_example
from hypothesis import strategies as st

from transactional.config import RunnerConfig
from transactional.errors import (
    AttemptTimeoutError,
    ConfigurationError,
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
    Command,
    Commit,
    CommitBegan,
    Committed,
    Drop,
    Emit,
    Event,
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
    Skip,
    Skipped,
    Started,
    Tick,
    Verified,
    Verify,
)
from transactional.types import Guarantee, TransactionAttempt

EXAMPLES = 500


class Boom(Exception):
    """A transient failure the world injects."""


@dataclass
class Store:
    """``currtx`` and each started txid's range ``(start, end)`` of the source."""

    currtx: int = 1
    metas: dict[int, tuple[int, int]] = field(default_factory=dict)
    group: tuple[int, int] | None = None

    def start(self, txid: int, meta: tuple[int, int]) -> None:
        assert txid not in self.metas, f"metadata of txid {txid} written twice"
        assert txid >= self.currtx
        self.metas[txid] = meta

    def record_group(self, first: int, last: int) -> None:
        assert first == self.currtx and first < last
        assert all(t in self.metas for t in range(first, last + 1))
        if self.group is not None and self.group[0] == first:
            assert self.group == (first, last), f"group {self.group} changed to {first}..{last}"
        self.group = (first, last)

    def advance(self, txid: int, first: int) -> None:
        assert first == self.currtx, f"advance from {first} with currtx={self.currtx}"
        if first != txid:
            assert self.group == (first, txid), f"advance of {first}..{txid}, not {self.group}"
        self.currtx = txid + 1
        self.metas = {t: m for t, m in self.metas.items() if t >= txid}

    def retract(self, txid: int) -> None:
        assert txid >= self.currtx
        group = self.group
        assert group is None or group[0] != self.currtx or txid > group[1], "retract in a group"
        self.metas = {t: m for t, m in self.metas.items() if t < txid}


@dataclass
class Sink:
    """An idempotent sink: it keeps its last txid with the data."""

    last: int = 0
    applied: list[int] = field(default_factory=list)  # source positions, in commit order
    commits: list[int] = field(default_factory=list)

    #: at_most_once: the txids in between may have been dropped.
    gaps: bool = False
    #: at_least_once: every commit applies; ``last`` ends the unbroken run of txids
    #: applied from the first, ``ahead`` holds those applied past it.
    unchecked: bool = False
    ahead: set[int] = field(default_factory=set)
    #: at_least_once: the attempts applied, with the run (machine) that made each.
    attempts: set[tuple[int, TransactionAttempt]] = field(default_factory=set)

    def commit(
        self, attempt: TransactionAttempt, last: int, metas: list[tuple[int, int]], run: int
    ) -> None:
        first = attempt.txid
        if self.unchecked:
            assert (run, attempt) not in self.attempts, f"{attempt} of run {run} applied twice"
            self.attempts.add((run, attempt))
            for meta in metas:
                self.applied.extend(range(*meta))
            self.ahead.update(range(first, last + 1))
            while self.last + 1 in self.ahead:
                self.last += 1
            self.ahead = {t for t in self.ahead if t > self.last}
            self.commits.append(last)
            return
        if last <= self.last:
            return  # a replay: skipped
        if self.gaps:
            assert first > self.last, f"commit of {first}..{last} after {self.last}"
        else:
            assert first == self.last + 1, f"commit of {first}..{last} after {self.last}"
        for meta in metas:
            self.applied.extend(range(*meta))
        self.last = last
        self.commits.append(last)


@dataclass
class World:
    """Answers the machine's commands; ``pending`` holds what a worker or the commit
    thread will report later."""

    batch: int
    available: int
    #: ``is_ready`` always says yes: a batch past the data is empty (and retracted).
    always_ready: bool = False
    store: Store = field(default_factory=Store)
    sink: Sink = field(default_factory=Sink)
    now: float = 0.0
    pending: list[Event] = field(default_factory=list)
    #: Queued commits: the group's first attempt and its last txid.
    commits_queued: list[tuple[TransactionAttempt, int]] = field(default_factory=list)
    idle: tuple[int, tuple[int, int]] | None = None
    cancelled: set[TransactionAttempt] = field(default_factory=set)
    halted: Halt | None = None
    log: list[str] = field(default_factory=list)
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    #: at_most_once: the source ranges of the txids the store moved past without a
    #: commit, and the txids the machine reported dropped (``Drop``, ``Opened.dropped``).
    lost: dict[int, tuple[int, int]] = field(default_factory=dict)
    reported: set[int] = field(default_factory=set)
    #: Where the source stands after the last txid the store moved past.
    position: int = 0
    #: Machines started so far (attempt ids start again at 1 in each).
    runs: int = 1
    #: The most commits queued at once (more than one: they overlapped).
    most_queued: int = 0

    def __post_init__(self) -> None:
        self.sink.gaps = self.guarantee is Guarantee.AT_MOST_ONCE
        self.sink.unchecked = self.guarantee is Guarantee.AT_LEAST_ONCE

    def decide(self, txid: int) -> tuple[int, int] | None:
        prev = self.store.metas.get(txid - 1)
        start = prev[1] if prev else self.sink_position(txid)
        if start >= self.available and not self.always_ready:
            return None  # is_ready says no
        return (start, min(self.available, start + self.batch))

    def behind(self) -> bool:
        """The source holds more than the txids decided took (``Spout.lag`` above 0):
        a caught-up source has the machine decide the next txid only once none is
        processing."""
        return self.available > max((end for _, end in self.store.metas.values()), default=0)

    def sink_position(self, txid: int) -> int:
        """Where txid starts when txid - 1's metadata was cleaned: after the sink's data
        (at_most_once: after the last txid the store moved past, committed or not)."""
        assert txid == self.store.currtx, f"no previous metadata for {txid}"
        if self.guarantee is not Guarantee.EXACTLY_ONCE:
            return self.position
        return len(self.sink.applied)

    def advance(self, txid: int, first: int) -> None:
        self.store.advance(txid, first)
        self.position = self.store.metas[txid][1]

    def skip(self, txid: int, in_sink: bool) -> None:
        """at_most_once: the store moves past ``txid`` with no commit."""
        meta = self.store.metas[txid]
        assert in_sink == (txid <= self.sink.last), f"txid {txid} in the sink: {in_sink}?"
        if not in_sink:
            self.lost[txid] = meta
        self.advance(txid, txid)

    def answer(self, command: Command, fail: Callable[[str], bool]) -> list[Event]:
        """What the executor reports at once for ``command``; later reports go to
        ``pending``."""
        self.log.append(f"  -> {command}")
        match command:
            case Emit(attempt, _):
                meta = self.decide(attempt.txid)
                if meta is None or self.idle == (attempt.txid, meta):
                    return [NotReady(attempt.txid)]
                if fail("before its metadata is stored"):
                    return [Failed(attempt, Boom("start"), Phase.START)]
                self.store.start(attempt.txid, meta)
                if fail("after its metadata is stored"):
                    return [Failed(attempt, Boom("emit"), Phase.START, stored=True)]
                self.pending.append(self.processed(attempt, meta, fail))
                return [Started(attempt, backlog=self.behind())]
            case Replay(attempt, _):
                assert attempt.txid in self.store.metas, f"replay of unstored {attempt.txid}"
                if fail("replay"):
                    return [Failed(attempt, Boom("replay"), Phase.START)]
                meta = self.store.metas[attempt.txid]
                self.pending.append(self.processed(attempt, meta, fail))
                return [Started(attempt, backlog=self.behind())]
            case Verify(attempt):
                return [Verified(attempt)]
            case Commit(attempt, _, more):
                last = more[-1][0].txid if more else attempt.txid
                if more:
                    if fail("record the group"):
                        return [Failed(attempt, Boom("record"), Phase.COMMIT)]
                    self.store.record_group(attempt.txid, last)
                self.commits_queued.append((attempt, last))
                self.most_queued = max(self.most_queued, len(self.commits_queued))
                return []
            case Advance(attempt, through):
                if fail("advance"):
                    return [Failed(attempt, Boom("advance"), Phase.ADVANCE)]
                self.advance(through, attempt.txid)
                return [Advanced(attempt)]
            case Skip(attempt, _, _, in_sink):
                assert self.guarantee is Guarantee.AT_MOST_ONCE
                if fail("skip"):
                    return [Failed(attempt, Boom("skip"), Phase.ADVANCE)]
                self.skip(attempt.txid, in_sink)
                return [Skipped(attempt)]
            case Drop(attempt):
                assert attempt.txid not in self.reported, f"txid {attempt.txid} dropped twice"
                self.reported.add(attempt.txid)
                return []
            case Retract(attempt):
                meta = self.store.metas[attempt.txid]
                self.store.retract(attempt.txid)
                self.idle = (attempt.txid, meta)
                return [Retracted(attempt)]
            case Cancel(attempt, _):
                self.cancelled.add(attempt)
                return []
            case Reacquire(_):
                return [self.opened()]
            case Halt():
                self.halted = command
                return []
            case Acknowledge() | Backoff():
                return []
        raise AssertionError(f"unknown command {command}")

    def processed(
        self, attempt: TransactionAttempt, meta: tuple[int, int], fail: Callable[[str], bool]
    ) -> Processed:
        """What the worker will report; a committer may refuse to group it."""
        records = meta[1] - meta[0]
        return Processed(attempt, records, records == 0, groupable=not fail("ungroupable"))

    def opened(self) -> Opened:
        if self.guarantee is not Guarantee.AT_MOST_ONCE:
            return Opened(self.store.currtx, frozenset(self.store.metas), self.store.group)
        # ``runtime.settle``: what was in flight is never replayed.
        pending = sorted(t for t in self.store.metas if t >= self.store.currtx)
        dropped = tuple(t for t in pending if t > self.sink.last)
        for txid in pending:
            self.skip(txid, txid <= self.sink.last)
        self.reported.update(dropped)
        return Opened(self.store.currtx, frozenset(), None, dropped)


def run_commands(
    machine: Machine, world: World, commands: list[Command], fail: Callable[[str], bool]
) -> None:
    """Carry out commands (and what they report at once) as the executor does."""
    todo = list(commands)
    while todo and world.halted is None:
        command = todo.pop(0)
        for event in world.answer(command, fail):
            world.log.append(f"{event}")
            todo.extend(machine.step(event, world.now))


def commit_thread(
    world: World, attempt: TransactionAttempt, last: int, outcome: str
) -> list[Event]:
    """The commit thread takes up a queued commit (one txid or a group): it applies,
    fails, or applies and then reports a failure (a lost reply: the outcome is unknown
    to the runner)."""
    metas = [world.store.metas[t] for t in range(attempt.txid, last + 1)]
    if outcome == "fail":
        return [CommitBegan(attempt), Failed(attempt, Boom("commit"), Phase.COMMIT)]
    world.sink.commit(attempt, last, metas, world.runs)
    if outcome == "lost reply" and world.guarantee is not Guarantee.AT_MOST_ONCE:
        return [CommitBegan(attempt), Failed(attempt, Boom("reply lost"), Phase.COMMIT)]
    # at_most_once: a commit that raised is committed if the sink holds it (the executor
    # reads the sink before it reports a failure).
    return [CommitBegan(attempt), Committed(attempt)]


ACTIONS = ["tick", "worker", "commit", "data", "leadership", "crash", "fenced", "timeout"]


def config_of(guarantee: Guarantee, **knobs: object) -> RunnerConfig:
    return RunnerConfig(
        topology_id="machine",
        guarantee=guarantee,
        max_attempts=4,
        attempt_timeout_s=10.0,
        backoff_initial_s=0.5,
        backoff_max_s=2.0,
        poll_interval_s=1.0,
        poll_max_s=8.0,
        max_reelections=100,
        **knobs,  # type: ignore[arg-type]
    )


def run_schedule(
    config: RunnerConfig,
    world: World,
    total: int,
    steps: int,
    data: st.DataObject,
    overlap: int = 1,
) -> Machine:
    """Runs ``steps`` actions hypothesis picks (with faults), then drains with none: every
    worker and commit completes and time passes until every record is in the sink or was
    lost with its txid. Returns the last machine (a crash or a poison batch starts a new
    one from the store). With ``overlap`` above 1, queued commits finish in any order."""
    at_most_once = config.guarantee is Guarantee.AT_MOST_ONCE

    def fail(what: str) -> bool:
        return data.draw(st.sampled_from([False, False, False, True]), label=f"fail {what}")

    def restart(why: str) -> Machine:
        world.log.append(f"restart ({why}) from currtx={world.store.currtx}")
        world.runs += 1
        world.pending.clear()
        world.commits_queued.clear()
        world.halted = None
        world.idle = None
        fresh = Machine(config, overlap=overlap)
        run_commands(fresh, world, fresh.step(world.opened(), world.now), fail)
        return fresh

    def gone(attempt: TransactionAttempt) -> bool:
        """The store moved past the queued commit (at_most_once: dropped) or retracted it
        (cannot happen for a queued commit)."""
        if at_most_once:
            return attempt.txid < world.store.currtx
        return attempt.txid not in world.store.metas

    machine = Machine(config, overlap=overlap)
    run_commands(machine, world, machine.step(Opened(1, frozenset()), world.now), fail)
    crashes = 0
    try:
        for _ in range(steps):
            action = data.draw(st.sampled_from(ACTIONS), label="action")
            world.log.append(f"{action} at t={world.now}")
            if action == "tick":
                world.now += data.draw(st.sampled_from([0.0, 0.5, 1.0, 4.0, 11.0]), label="dt")
                run_commands(machine, world, machine.step(Tick(), world.now), fail)
            elif action == "worker" and world.pending:
                event = world.pending.pop(data.draw(st.integers(0, len(world.pending) - 1)))
                if data.draw(st.booleans(), label="worker fails") and isinstance(event, Processed):
                    event = Failed(event.attempt, Boom("process"), Phase.PROCESS)
                world.log.append(f"{event}")
                run_commands(machine, world, machine.step(event, world.now), fail)
            elif action == "commit" and world.commits_queued:
                queued = len(world.commits_queued) - 1  # one commit thread: in order
                which = data.draw(st.integers(0, queued), label="commit") if overlap > 1 else 0
                attempt, last = world.commits_queued.pop(which)
                if gone(attempt):
                    continue
                outcome = data.draw(st.sampled_from(["ok", "ok", "fail", "lost reply"]))
                for event in commit_thread(world, attempt, last, outcome):
                    world.log.append(f"{event} ({outcome})")
                    run_commands(machine, world, machine.step(event, world.now), fail)
            elif action == "data" and world.available < total:
                world.available = data.draw(st.integers(world.available + 1, total))
            elif action == "leadership":
                lost = LeadershipLost(LostLeadershipError("session expired"))
                run_commands(machine, world, machine.step(lost, world.now), fail)
            elif action == "fenced" and not at_most_once:
                run_commands(
                    machine,
                    world,
                    machine.step(LeadershipLost(FencedError("newer")), world.now),
                    fail,
                )
                assert world.halted is not None and world.halted.reason is HaltReason.DEPOSED
                machine = restart("deposed, started again")
            elif action == "timeout":
                world.now += config.attempt_timeout_s or 0
                run_commands(machine, world, machine.step(Tick(), world.now), fail)
            elif action == "crash" and crashes < 3:
                crashes += 1
                machine = restart("crash")
            if world.halted is not None:
                assert world.halted.reason is HaltReason.POISON, world.halted
                # at_most_once never retries, so no attempt lives to time out twice.
                poisons = Boom if at_most_once else (Boom, AttemptTimeoutError)
                assert isinstance(world.halted.error, poisons)
                machine = restart("poison batch: the operator removed the cause")

        # Drain: no more faults; time passes, every worker and commit completes.
        world.log.append("drain")
        world.available = total
        for _ in range(2000):
            done = len(set(world.sink.applied)) + sum(b - a for a, b in world.lost.values())
            if world.pending:
                event = world.pending.pop(0)
                run_commands(machine, world, machine.step(event, world.now), never)
            elif world.commits_queued:
                attempt, last = world.commits_queued.pop(0)
                if not gone(attempt):
                    for event in commit_thread(world, attempt, last, "ok"):
                        run_commands(machine, world, machine.step(event, world.now), never)
            elif machine.drained(world.now) and done == total:
                break
            else:
                world.now += machine.wait_time(world.now)
                run_commands(machine, world, machine.step(Tick(), world.now), never)
            assert world.halted is None, world.halted
    finally:
        note("\n".join(world.log[-300:]))  # the schedule, when an example fails
    assert machine.drained(world.now), "did not drain"
    return machine


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    max_pending=st.integers(1, 4),
    max_group=st.integers(1, 4),
    group_wait=st.sampled_from([0.0, 0.0, 2.0]),
    batch=st.integers(1, 5),
    total=st.integers(0, 30),
    steps=st.integers(10, 120),
    data=st.data(),
)
def test_random_schedules_keep_every_invariant_and_count_each_record_once(
    max_pending: int,
    max_group: int,
    group_wait: float,
    batch: int,
    total: int,
    steps: int,
    data: st.DataObject,
) -> None:
    config = config_of(
        Guarantee.EXACTLY_ONCE,
        max_pending=max_pending,
        max_group=max_group,
        group_wait_s=group_wait,
    )
    initially = data.draw(st.integers(0, total), label="available at start")
    world = World(batch, initially, data.draw(st.booleans(), label="always ready"))
    machine = run_schedule(config, world, total, steps, data)
    assert world.sink.applied == list(range(total)), "records lost or counted twice"
    commits = world.sink.commits  # the last txid of each commit (a group's, or its own)
    assert commits == sorted(set(commits))
    steps_of = [b - a for a, b in zip([0, *commits], commits, strict=False)]
    assert all(1 <= n <= max_group for n in steps_of), f"a group above max_group: {commits}"
    label_example(f"commit groups of 2+: {'yes' if any(n > 1 for n in steps_of) else 'no'}")
    assert world.store.currtx == machine.currtx == world.sink.last + 1


def never(what: str) -> bool:
    return False


#: The weaker guarantees' schedules: half as many examples each.
WEAKER = settings(
    max_examples=EXAMPLES // 2,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def world_of(guarantee: Guarantee, batch: int, total: int, data: st.DataObject) -> World:
    initially = data.draw(st.integers(0, total), label="available at start")
    always = data.draw(st.booleans(), label="always ready")
    return World(batch, initially, always, guarantee=guarantee)


def test_a_configuration_error_halts_at_once() -> None:
    machine = Machine(RunnerConfig(topology_id="machine", max_pending=2))
    out = machine.step(Opened(1, frozenset()), 0.0)
    assert out == [Emit(TransactionAttempt(1, 1), 1)]
    error = ConfigurationError("bad")
    out = machine.step(Failed(TransactionAttempt(1, 1), error, Phase.START), 0.0)
    assert out == [Halt(HaltReason.CONFIGURATION, error, 1, Phase.START, 1)]


@WEAKER
@given(
    max_pending=st.integers(1, 4),
    max_group=st.integers(1, 4),
    batch=st.integers(1, 5),
    total=st.integers(0, 30),
    steps=st.integers(10, 120),
    data=st.data(),
)
def test_at_most_once_counts_each_record_at_most_once_and_loses_only_what_it_reported(
    max_pending: int,
    max_group: int,
    batch: int,
    total: int,
    steps: int,
    data: st.DataObject,
) -> None:
    config = config_of(Guarantee.AT_MOST_ONCE, max_pending=max_pending, max_group=max_group)
    world = world_of(Guarantee.AT_MOST_ONCE, batch, total, data)
    machine = run_schedule(config, world, total, steps, data)
    applied = world.sink.applied
    assert len(applied) == len(set(applied)), "a record counted twice"
    lost = {r for a, b in world.lost.values() for r in range(a, b)}
    assert set(range(total)) - set(applied) == lost, "lost records that were not dropped"
    assert set(world.lost) <= world.reported, "a txid dropped without a report"
    assert not lost & set(applied)
    label_example(f"dropped: {'yes' if world.lost else 'no'}")
    assert world.store.currtx == machine.currtx


@WEAKER
@given(
    max_pending=st.integers(1, 4),
    max_group=st.integers(1, 4),
    overlapping=st.booleans(),
    batch=st.integers(1, 5),
    total=st.integers(0, 30),
    steps=st.integers(10, 120),
    data=st.data(),
)
def test_at_least_once_loses_nothing_and_applies_again_only_what_it_replayed(
    max_pending: int,
    max_group: int,
    overlapping: bool,
    batch: int,
    total: int,
    steps: int,
    data: st.DataObject,
) -> None:
    config = config_of(Guarantee.AT_LEAST_ONCE, max_pending=max_pending, max_group=max_group)
    world = world_of(Guarantee.AT_LEAST_ONCE, batch, total, data)
    overlap = max_pending if overlapping else 1
    machine = run_schedule(config, world, total, steps, data, overlap)
    applied = world.sink.applied
    assert set(applied) == set(range(total)), "records lost"
    # Each attempt was applied at most once (the sink asserts it): a record applied twice
    # was applied again by a later attempt of its txid, which only a replay starts.
    assert world.store.currtx == machine.currtx == world.sink.last + 1
    assert not world.sink.ahead, f"applied past the store: {world.sink.ahead}"
    label_example(f"commits ran together: {world.most_queued > 1}")
    label_example(f"applied again: {len(applied) > total}")
