"""The planted bugs: each a plausible mistake in the protocol, planted by patching the
product at run time (``planted``), with the tests meant to catch it.

A patch changes one decision of the product the way a careless change would, and checks
that what it replaces is still there (``_replaced``): a patch gone stale after the
product moved fails loudly instead of planting nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

#: The crash matrix's chains (both sinks of one chain run share it).
MATRIX = "tests/e2e/test_crash_matrix.py::test_killed_at_every_step_then_rerun_counts_exactly"
#: The ledger's test of a bolt whose counts balance though it swapped a record.
SWAP = (
    "tests/integration/test_ledger.py::test_a_bolt_that_swaps_one_record_for_another_fails_its_txid"
)
_GUARANTEES = (
    "tests/e2e/test_guarantee_crashes.py::"
    "test_killed_at_every_step_keeps_the_guarantees_promise_exactly"
)
_RANDOM = "tests/e2e/test_crash_matrix.py::test_random_sigkills_then_drain_count_exactly"
_CAMPAIGN = (
    "tests/cluster/test_chaos_campaign.py::"
    "test_a_short_campaign_fires_every_kind_of_fault_and_nothing_is_lost_or_counted_twice"
)
_CUT_OFF = (
    "tests/e2e/test_network_faults.py::"
    "test_a_leader_cut_off_from_zookeeper_mid_commit_commits_nothing_once_replaced"
)
_CONTENTION = (
    "tests/e2e/test_contention.py::"
    "test_deposed_leaders_write_nothing_while_the_others_take_over[s3-2-runners]"
)


def _chain(test: str, *cases: str) -> tuple[str, ...]:
    return tuple(f"{test}[{case}]" for case in cases)


#: The crash matrix's partitioned chain, on local files and tables, both sinks.
_PARTITIONED = _chain(MATRIX, "partitioned-redis", "partitioned-delta")


@dataclass(frozen=True)
class Bug:
    name: str
    #: What the bug does, in a line.
    what: str
    plant: Callable[[pytest.MonkeyPatch], None]
    #: The tests run against it, in order, until one fails.
    targets: tuple[str, ...]


def _replaced(text: str, old: str, new: str, where: str) -> str:
    if text.count(old) != 1:
        raise AssertionError(f"planted bug out of date: {where} no longer holds {old!r} once")
    return text.replace(old, new)


def _lua(mp: pytest.MonkeyPatch, old: str, new: str) -> None:
    """The Redis committer's commit script with ``old`` replaced by ``new``."""
    from committers.redis import _committer

    script = _replaced(_committer.COMMIT_SCRIPT, old, new, "committers/redis/_commit.lua")
    mp.setattr(_committer, "COMMIT_SCRIPT", script)


# ------------------------------------------------------------------ the sinks


def _redis_replays_held_txid(mp: pytest.MonkeyPatch) -> None:
    _lua(mp, "if last_n and txid <= last_n and not opaque then", "if false then")


def _redis_opaque_keeps_dropped_keys(mp: pytest.MonkeyPatch) -> None:
    # The replay's undo restores no field: a field the new attempt also has is still
    # computed from its undo value, so only a key the replay no longer has stays wrong.
    old = "  for i = 1, #entries, 2 do\n    local k, prev"
    _lua(mp, old, "  for i = 1, 0, 2 do\n    local k, prev")


def _redis_marker_first(mp: pytest.MonkeyPatch) -> None:
    # Transactional mode: the committer checks the marker and sets it by commands of
    # its own, then the script writes the data (its own check off, or it would skip).
    from committers.redis._committer import RedisCommitter
    from transactional.types import CommitMode, CommitOutcome

    _redis_replays_held_txid(mp)
    commit = RedisCommitter._commit

    def marker_first(self: RedisCommitter, first: int, last: int, prepared: Any) -> Any:
        if self.mode is not CommitMode.TRANSACTIONAL:
            return commit(self, first, last, prepared)
        client, marker = self._connection.server(), self._names.key("txid")
        held = client.get(marker)
        if held is not None and int(held) >= last:
            return CommitOutcome.SKIPPED
        client.set(marker, last)
        return commit(self, first, last, prepared)

    mp.setattr(RedisCommitter, "_commit", marker_first)


def _dead_letters_outside_txid(mp: pytest.MonkeyPatch) -> None:
    import dataclasses

    from committers.redis._committer import RedisCommitter

    commit = RedisCommitter._commit

    def pushed_first(self: RedisCommitter, first: int, last: int, prepared: Any) -> Any:
        if prepared.dead_letters:
            self._connection.server().rpush(self._names.dead_letters, *prepared.dead_letters)
            prepared = dataclasses.replace(prepared, dead_letters=[])
        return commit(self, first, last, prepared)

    mp.setattr(RedisCommitter, "_commit", pushed_first)


def _delta_marker_apart(mp: pytest.MonkeyPatch) -> None:
    # The rows committed with no marker, the marker in an empty commit after them: a
    # crash between the two leaves rows that no marker says are there.
    import deltalake.transaction

    from committers.delta import _arrow, _rs

    merge, marked = _arrow.merge_counts, deltalake.transaction.CommitProperties

    def unmarked(*args: Any, app_transactions: Any = None, **kwargs: Any) -> Any:
        return marked(*args, **kwargs)

    def apart(
        dt: Any, table: Any, sums: Any, span: Any, mode: Any, marker: Any, *rest: Any
    ) -> None:
        # ``rest``: what else merge_counts takes (the commit's note), passed on as given.
        from deltalake import write_deltalake

        from committers.delta._parquet import arrow_schema

        with pytest.MonkeyPatch.context() as inner:
            inner.setattr(deltalake.transaction, "CommitProperties", unmarked)
            merge(dt, table, sums, span, mode, marker, *rest)
        dt.update_incremental()
        properties = _arrow.commit_properties(marker, *rest)
        write_deltalake(
            dt, arrow_schema(dt).empty_table(), mode="append", commit_properties=properties
        )

    mp.setattr(_rs, "merge_counts", apart)


# ------------------------------------------------------------------ the runner


def _store_advances_before_sink(mp: pytest.MonkeyPatch) -> None:
    from transactional.runtime import messages as m
    from transactional.runtime.executor import Executor

    commit = Executor._commit

    def advance_first(self: Executor, command: Any) -> Any:
        last = command.members[-1][0].txid
        self.driver.advance(self.driver.batches[last], first=command.attempt.txid)
        return commit(self, command)

    def advanced(self: Executor, through: int, batch: Any) -> Any:
        return m.Advanced(batch.attempt)  # done before the commit

    mp.setattr(Executor, "_commit", advance_first)
    mp.setattr(Executor, "_advance", advanced)


def _group_commits_backwards(mp: pytest.MonkeyPatch) -> None:
    # A group written as its txids one by one, from the last: the sinks then hold the
    # last txid first and skip the ones below it.
    from transactional.runtime.commit import CommitSequence

    one = CommitSequence._commit_one

    def backwards(self: CommitSequence, node: Any, attempts: Any, prepared: Any) -> Any:
        if len(attempts) == 1:
            return one(self, node, attempts, prepared)
        outcomes = [
            one(self, node, [attempt], [batch])
            for attempt, batch in reversed(list(zip(attempts, prepared, strict=True)))
            if batch is not None
        ]
        return outcomes[0]

    mp.setattr(CommitSequence, "_commit_one", backwards)


def _deposed_leader_writes(mp: pytest.MonkeyPatch) -> None:
    # No leadership check before a commit, and the sinks' fences no longer refuse a
    # lower token.
    from committers.delta._target import DeltaTarget
    from transactional.runtime.leadership import LeaderSession

    mp.setattr(LeaderSession, "check", lambda self: None)
    mp.setattr(DeltaTarget, "check_fence", lambda self, held, table: None)
    _lua(mp, "  if fence < held then", "  if false then")


def _guarantee_opened(mp: pytest.MonkeyPatch, swap: Callable[[Any], Any]) -> None:
    """The start's reading of the store's pending txids under another guarantee."""
    from transactional import runner
    from transactional.runtime import executor, settle

    original = settle.opened

    def opened(driver: Any, committers: Any, state: Any, stored: Any, guarantee: Any) -> Any:
        return original(driver, committers, state, stored, swap(guarantee))

    mp.setattr(runner, "opened", opened)
    mp.setattr(executor, "opened", opened)


def _at_most_once_retries(mp: pytest.MonkeyPatch) -> None:
    from transactional.runtime.machine import Machine
    from transactional.types import Guarantee

    def swap(guarantee: Guarantee) -> Guarantee:
        return Guarantee.EXACTLY_ONCE if guarantee is Guarantee.AT_MOST_ONCE else guarantee

    _guarantee_opened(mp, swap)
    mp.setattr(Machine, "_drops_for_good", lambda self, txid, error, phase: False)


def _at_least_once_skips_replay(mp: pytest.MonkeyPatch) -> None:
    from transactional.types import Guarantee

    def swap(guarantee: Guarantee) -> Guarantee:
        return Guarantee.AT_MOST_ONCE if guarantee is Guarantee.AT_LEAST_ONCE else guarantee

    _guarantee_opened(mp, swap)


# ------------------------------------------------------------------ spouts and ledger


def _replay_differs(mp: pytest.MonkeyPatch) -> None:
    # The file sequence's replay (a txid this process did not decide) loses its first
    # record: what the determinism check exists for, run without it.
    from transactional.sources.files._spouts import FilesTransactionalSpout

    decided: set[Any] = set()
    initialize, emit = (
        FilesTransactionalSpout.initialize_transaction,
        FilesTransactionalSpout.emit_batch,
    )

    def initialize_transaction(self: Any, txid: int, prev_meta: Any) -> Any:
        meta = initialize(self, txid, prev_meta)
        decided.add(meta)
        return meta

    def emit_batch(self: Any, attempt: Any, meta: Any) -> Any:
        frame = emit(self, attempt, meta)
        return frame if meta in decided else frame.offset(1)

    mp.setattr(FilesTransactionalSpout, "initialize_transaction", initialize_transaction)
    mp.setattr(FilesTransactionalSpout, "emit_batch", emit_batch)


def _ledger_ignores_xor(mp: pytest.MonkeyPatch) -> None:
    from transactional.ledger import Tally

    mp.setattr(Tally, "of", classmethod(lambda cls, records, xor: cls(int(records or 0), 0)))


BUGS = {
    bug.name: bug
    for bug in (
        Bug(
            "redis-replays-held-txid",
            "the Redis script applies a transactional commit of a txid it already holds",
            _redis_replays_held_txid,
            _PARTITIONED,
        ),
        Bug(
            "redis-opaque-keeps-dropped-keys",
            "an opaque Redis replay does not undo the keys its new attempt no longer has",
            _redis_opaque_keeps_dropped_keys,
            (
                *_chain(MATRIX, "opaque-redis", "opaque-delta"),
                *_chain(_GUARANTEES, "at_least_once-opaque-redis", "at_least_once-opaque-delta"),
                "tests/integration/test_committer_contract.py::TestRedisCommitter::"
                "test_an_opaque_replay_undoes_the_earlier_attempt_even_keys_it_dropped",
            ),
        ),
        Bug(
            "redis-marker-first",
            "the Redis committer sets its txid marker by its own command before the data",
            _redis_marker_first,
            (*_PARTITIONED, _RANDOM),
        ),
        Bug(
            "dead-letters-outside-txid",
            "the Redis committer pushes a commit's dead letters before its script",
            _dead_letters_outside_txid,
            _PARTITIONED,
        ),
        Bug(
            "delta-marker-apart",
            "the Delta committer commits its txid marker apart from the data",
            _delta_marker_apart,
            (*_PARTITIONED, _RANDOM),
        ),
        Bug(
            "store-advances-before-sink",
            "the store moves past a txid before the sinks write it",
            _store_advances_before_sink,
            _PARTITIONED,
        ),
        Bug(
            "group-commits-backwards",
            "a commit group is written txid by txid, from its last",
            _group_commits_backwards,
            _PARTITIONED,
        ),
        Bug(
            "deposed-leader-writes",
            "a leader commits without checking it still leads, and the sinks take any fence",
            _deposed_leader_writes,
            (_CONTENTION, _CUT_OFF),
        ),
        Bug(
            "at-most-once-retries",
            "at_most_once replays the txids it found started, and retries a failed txid",
            _at_most_once_retries,
            _chain(
                _GUARANTEES, "at_most_once-transactional-redis", "at_most_once-transactional-delta"
            ),
        ),
        Bug(
            "at-least-once-skips-replay",
            "at_least_once moves past the txids it found started instead of replaying them",
            _at_least_once_skips_replay,
            _chain(
                _GUARANTEES,
                "at_least_once-transactional-redis",
                "at_least_once-transactional-delta",
            ),
        ),
        Bug(
            "replay-differs-unchecked",
            "the file sequence's replay loses a record, under a guarantee with no determinism check",
            _replay_differs,
            _chain(
                _GUARANTEES,
                "at_least_once-transactional-redis",
                "at_least_once-transactional-delta",
            ),
        ),
        Bug(
            "ledger-ignores-xor",
            "the ledger compares record counts only, not the XOR of their ids",
            _ledger_ignores_xor,
            (SWAP, "tests/unit/test_ledger.py"),
        ),
    )
}


@contextlib.contextmanager
def planted(names: str) -> Iterator[list[Bug]]:
    """The bugs ``names`` (comma-separated) in this process while the block runs: bugs
    of different parts, planted together, each caught by its own test."""
    bugs = []
    for name in names.split(","):
        if name not in BUGS:
            raise SystemExit(f"no planted bug {name!r}; the bugs: {', '.join(BUGS)}")
        bugs.append(BUGS[name])
    with pytest.MonkeyPatch.context() as mp:
        for bug in bugs:
            bug.plant(mp)
        yield bugs
