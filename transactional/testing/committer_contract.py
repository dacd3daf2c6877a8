"""What every committer must do (docs/design.md section 6), as a pytest suite to run on your
own committer.

Subclass ``CommitterContract`` in a test module and give it a ``sink`` fixture that
returns a ``SinkUnderTest`` for a fresh, empty sink::

    from transactional.testing.committer_contract import CommitterContract, SinkUnderTest

    class MySink(SinkUnderTest):
        def committer(self, mode): return MyCommitter(..., mode=mode)
        def inputs(self, counts): return {"default": spark.createDataFrame(...)}
        def read(self): return {...}   # key -> count, read from the sink itself

    class TestMyCommitter(CommitterContract):
        @pytest.fixture
        def sink(self, tmp_path): return MySink(tmp_path)

The suite checks, with counts computed here and read back from the sink: commits in
txid order are applied; a transactional replay of a committed txid changes nothing and
says ``SKIPPED``, also after a restart; an opaque replay undoes the earlier attempt
(keys it dropped included) and applies the new one; an opaque commit older than the
sink's is refused; under ``at_least_once`` and ``at_most_once`` a transactional-mode
commit of a txid the sink holds is applied again or skipped, as its outcome says, and
the sink's txid never moves back;
a deposed leader writes nothing (a lower fence token, or a failed
leadership check for sinks that cannot compare tokens); ``committed_txid`` reads the
sink, so a commit whose reply was lost is settled by reading, never guessed. For a
committer with commit groups (``Committer.commit_group``; set ``groups = True`` on the
suite): a group is applied whole and marked with its last txid, a
transactional replay of it is skipped, a sink holding a txid inside a group refuses
it, and an opaque replay of a group undoes the earlier write (a dropped key, a txid
that came out empty) and applies the new one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from transactional.committer import Committer, CommitterContext
from transactional.errors import FencedError, LostLeadershipError, TransactionalError
from transactional.types import CommitMode, CommitOutcome, Guarantee, TransactionAttempt

# pytest is imported by the tests that use it, so that ``transactional.testing``, which
# exports this suite, imports without pytest.
if TYPE_CHECKING:
    import pytest

__all__ = ["CommitterContract", "SinkUnderTest"]

TOPOLOGY = "contract"


class SinkUnderTest(ABC):
    """One empty sink, and how to reach it."""

    #: Whether the sink compares the fence token atomically with its write (a lower
    #: token is refused with ``FencedError``); otherwise the committer must call
    #: ``context.check_leadership()`` before writing.
    fences_by_token: ClassVar[bool] = True
    #: The committer's name in the topology (its context's ``name``).
    name: ClassVar[str] = "sink"

    @abstractmethod
    def committer(self, mode: CommitMode) -> Committer:
        """A new committer on this sink (not opened): a restarted process makes one."""

    @abstractmethod
    def inputs(self, counts: Mapping[str, int]) -> Mapping[str, Any]:
        """The committer's inputs for ``prepare``: the key -> count rows of a batch."""

    @abstractmethod
    def read(self) -> dict[str, int]:
        """Key -> count as the sink holds it now, read from the sink itself."""

    def spark(self) -> Any:
        """The session the committers' context carries (None: the sink needs none)."""
        return None


def _leads() -> None:
    """The leadership check of a runner that leads."""


def _deposed() -> None:
    raise LostLeadershipError("this runner was deposed (contract test)")


class CommitterContract:
    """The suite; see the module's docstring. ``modes``: the committer's modes (a test
    of a mode the committer does not have is not generated)."""

    modes: ClassVar[tuple[CommitMode, ...]] = (CommitMode.TRANSACTIONAL, CommitMode.OPAQUE)
    #: Whether the committer commits groups (``commit_group``): adds the group tests.
    groups: ClassVar[bool] = False

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        grouping = self.modes if self.groups else ()
        for name, wanted in (
            ("mode", self.modes),
            ("transactional", [m for m in self.modes if m is CommitMode.TRANSACTIONAL]),
            ("opaque", [m for m in self.modes if m is CommitMode.OPAQUE]),
            ("grouped", grouping),
            ("grouped_transactional", [m for m in grouping if m is CommitMode.TRANSACTIONAL]),
            ("grouped_opaque", [m for m in grouping if m is CommitMode.OPAQUE]),
        ):
            if name in metafunc.fixturenames:
                metafunc.parametrize(name, wanted, ids=str)

    # ------------------------------------------------------------------ helpers

    @contextmanager
    def opened(
        self,
        sink: SinkUnderTest,
        mode: CommitMode,
        token: int | None = 1,
        leads: Any = _leads,
        guarantee: Guarantee = Guarantee.EXACTLY_ONCE,
    ) -> Iterator[Committer]:
        """A new committer on ``sink``, opened as a runner would open it, closed after."""
        committer = sink.committer(mode)
        context = CommitterContext(sink.spark(), TOPOLOGY, sink.name, token, leads, guarantee)
        committer.open(context)
        try:
            yield committer
        finally:
            committer.close()

    def commit(
        self, sink: SinkUnderTest, committer: Committer, txid: int, counts: Mapping[str, int]
    ) -> CommitOutcome:
        self._attempts = getattr(self, "_attempts", 0) + 1
        attempt = TransactionAttempt(txid, self._attempts)
        return committer.commit(attempt, committer.prepare(attempt, sink.inputs(counts)))

    def commit_group(
        self,
        sink: SinkUnderTest,
        committer: Committer,
        first: int,
        batches: Sequence[Mapping[str, int] | None],
    ) -> CommitOutcome:
        """Commit txids ``first``.. as one group (None: a txid that came out empty)."""
        attempts, prepared = [], []
        for txid, counts in enumerate(batches, first):
            self._attempts = getattr(self, "_attempts", 0) + 1
            attempt = TransactionAttempt(txid, self._attempts)
            attempts.append(attempt)
            given = None if counts is None else committer.prepare(attempt, sink.inputs(counts))
            prepared.append(given)
        return committer.commit_group(attempts, prepared)

    # ------------------------------------------------------------------ the contract

    def test_commits_in_txid_order_are_applied(self, sink: SinkUnderTest, mode: CommitMode) -> None:
        batches = [{"a": 1, "b": 2}, {"a": 3, "c": 1}, {"b": 5}]
        with self.opened(sink, mode) as committer:
            outcomes = [self.commit(sink, committer, t, b) for t, b in enumerate(batches, 1)]
        assert outcomes == [CommitOutcome.APPLIED] * 3
        assert sink.read() == dict(sum((Counter(b) for b in batches), Counter()))

    def test_a_transactional_replay_is_skipped_also_after_a_restart(
        self, sink: SinkUnderTest, transactional: CommitMode
    ) -> None:
        with self.opened(sink, transactional) as first:
            assert self.commit(sink, first, 1, {"a": 1}) is CommitOutcome.APPLIED
            assert self.commit(sink, first, 2, {"a": 2, "b": 1}) is CommitOutcome.APPLIED
            assert self.commit(sink, first, 2, {"a": 2, "b": 1}) is CommitOutcome.SKIPPED
        with self.opened(sink, transactional) as restarted:
            assert self.commit(sink, restarted, 2, {"a": 2, "b": 1}) is CommitOutcome.SKIPPED
            assert self.commit(sink, restarted, 1, {"a": 1}) is CommitOutcome.SKIPPED
            assert self.commit(sink, restarted, 3, {"c": 4}) is CommitOutcome.APPLIED
        assert sink.read() == {"a": 3, "b": 1, "c": 4}

    def test_unchecked_a_held_txid_is_applied_again_or_skipped_as_it_says(
        self, sink: SinkUnderTest, transactional: CommitMode
    ) -> None:
        """Under ``at_least_once`` and ``at_most_once`` a transactional-mode commit need
        not check the sink's last txid (the built-in committers do not: a held txid is
        applied again); one that still checks is stronger than asked. Either way the
        outcome says which, and the sink's txid never moves back."""
        with self.opened(sink, transactional) as exact:
            assert self.commit(sink, exact, 1, {"a": 1}) is CommitOutcome.APPLIED
            assert self.commit(sink, exact, 2, {"a": 2, "b": 1}) is CommitOutcome.APPLIED
        expected = Counter({"a": 3, "b": 1})
        for guarantee in (Guarantee.AT_LEAST_ONCE, Guarantee.AT_MOST_ONCE):
            with self.opened(sink, transactional, guarantee=guarantee) as unchecked:
                for txid, batch in ((2, {"a": 2, "b": 1}), (1, {"c": 1})):  # held, older
                    outcome = self.commit(sink, unchecked, txid, batch)
                    assert outcome in (CommitOutcome.APPLIED, CommitOutcome.SKIPPED)
                    if outcome is CommitOutcome.APPLIED:
                        expected.update(batch)
                    assert sink.read() == dict(expected)
                    assert unchecked.committed_txid() in (2, None)
        with self.opened(sink, transactional) as exact:  # the checks hold again after
            assert self.commit(sink, exact, 2, {"a": 2, "b": 1}) is CommitOutcome.SKIPPED
            assert self.commit(sink, exact, 3, {"d": 1}) is CommitOutcome.APPLIED
        assert sink.read() == dict(expected + Counter({"d": 1}))

    def test_an_opaque_replay_undoes_the_earlier_attempt_even_keys_it_dropped(
        self, sink: SinkUnderTest, opaque: CommitMode
    ) -> None:
        with self.opened(sink, opaque) as committer:
            assert self.commit(sink, committer, 1, {"a": 1, "b": 2}) is CommitOutcome.APPLIED
            assert self.commit(sink, committer, 2, {"a": 1, "c": 5}) is CommitOutcome.APPLIED
        with self.opened(sink, opaque) as restarted:  # the replay comes after a crash
            # txid 2 replayed with another batch: "c" is gone from it, "a" changed.
            assert self.commit(sink, restarted, 2, {"a": 3}) is CommitOutcome.REAPPLIED
            assert sink.read() == {"a": 4, "b": 2}
            assert self.commit(sink, restarted, 3, {"c": 1}) is CommitOutcome.APPLIED
        assert sink.read() == {"a": 4, "b": 2, "c": 1}

    def test_a_txid_with_nothing_to_count_is_committed_and_replayed(
        self, sink: SinkUnderTest, mode: CommitMode
    ) -> None:
        """A batch with no rows for the table (every record of a small txid a dead
        letter) still marks its txid; in opaque mode a replay that comes out empty
        undoes the earlier attempt, and one that had come out empty is applied."""
        with self.opened(sink, mode) as committer:
            assert self.commit(sink, committer, 1, {"a": 1}) is CommitOutcome.APPLIED
            assert self.commit(sink, committer, 2, {}) is CommitOutcome.APPLIED
            assert self.commit(sink, committer, 3, {"b": 2}) is CommitOutcome.APPLIED
            assert committer.committed_txid() == 3
        if mode is not CommitMode.OPAQUE:
            assert sink.read() == {"a": 1, "b": 2}
            return
        with self.opened(sink, mode) as restarted:  # replays, after a crash
            assert self.commit(sink, restarted, 3, {}) is CommitOutcome.REAPPLIED
            assert sink.read() == {"a": 1}
            # Applied (whether the sink calls it a redo of the empty attempt or not).
            assert self.commit(sink, restarted, 3, {"c": 4}) is not CommitOutcome.SKIPPED
        assert sink.read() == {"a": 1, "c": 4}

    def test_an_opaque_commit_older_than_the_sink_is_refused(
        self, sink: SinkUnderTest, opaque: CommitMode
    ) -> None:
        import pytest

        with self.opened(sink, opaque) as committer:
            self.commit(sink, committer, 1, {"a": 1})
            self.commit(sink, committer, 2, {"a": 1})
            with pytest.raises(TransactionalError):
                self.commit(sink, committer, 1, {"a": 7})
        assert sink.read() == {"a": 2}

    def test_a_deposed_leader_writes_nothing(self, sink: SinkUnderTest, mode: CommitMode) -> None:
        import pytest

        with self.opened(sink, mode, token=2) as leader:
            self.commit(sink, leader, 1, {"a": 1})
        if sink.fences_by_token:  # a runner deposed without knowing it: a lower token
            deposed = self.opened(sink, mode, token=1)
            expected: type[Exception] = FencedError
        else:  # the sink cannot compare tokens: its leadership check must stop it
            deposed = self.opened(sink, mode, token=1, leads=_deposed)
            expected = LostLeadershipError
        with deposed as committer, pytest.raises(expected):
            self.commit(sink, committer, 2, {"a": 5, "z": 1})
        assert sink.read() == {"a": 1}
        with self.opened(sink, mode, token=2) as successor:
            assert successor.committed_txid() in (1, None)  # None: the sink cannot tell
            assert self.commit(sink, successor, 2, {"a": 1}) is CommitOutcome.APPLIED
        assert sink.read() == {"a": 2}

    def test_committed_txid_reads_the_sink_not_a_cache(
        self, sink: SinkUnderTest, mode: CommitMode
    ) -> None:
        # reader: another process's view of the same sink
        with self.opened(sink, mode) as writer, self.opened(sink, mode) as reader:
            assert reader.committed_txid() in (None, 0)
            self.commit(sink, writer, 1, {"a": 1})
            self.commit(sink, writer, 2, {"b": 1})
            # The runner asks this after a commit raised: a reply lost, not the write.
            assert reader.committed_txid() == 2

    # ------------------------------------------------------------------ commit groups

    def test_a_group_is_applied_whole_and_marked_with_its_last_txid(
        self, sink: SinkUnderTest, grouped: CommitMode
    ) -> None:
        batches = [{"a": 1, "b": 2}, {"a": 3, "c": 1}, {"b": 5, "d": 2}]
        with self.opened(sink, grouped) as committer:
            assert self.commit(sink, committer, 1, {"a": 10}) is CommitOutcome.APPLIED
            assert self.commit_group(sink, committer, 2, list(batches)) is CommitOutcome.APPLIED
            assert committer.committed_txid() in (4, None)  # None: the sink cannot tell
            assert self.commit(sink, committer, 5, {"e": 1}) is CommitOutcome.APPLIED
        expected = sum((Counter(b) for b in [{"a": 10}, *batches, {"e": 1}]), Counter())
        assert sink.read() == dict(expected)

    def test_a_transactional_group_replay_is_skipped_and_a_split_one_refused(
        self, sink: SinkUnderTest, grouped_transactional: CommitMode
    ) -> None:
        import pytest

        mode = grouped_transactional
        with self.opened(sink, mode) as committer:
            assert self.commit_group(sink, committer, 1, [{"a": 1}, {"b": 2}]) is (
                CommitOutcome.APPLIED
            )
            assert self.commit_group(sink, committer, 1, [{"a": 1}, {"b": 2}]) is (
                CommitOutcome.SKIPPED
            )
        with self.opened(sink, mode) as restarted:
            assert self.commit_group(sink, restarted, 1, [{"a": 1}, {"b": 2}]) is (
                CommitOutcome.SKIPPED
            )
            assert self.commit(sink, restarted, 3, {"c": 3}) is CommitOutcome.APPLIED
            # The sink holds 3: a group 3..4 would apply 3 twice or lose 4.
            with pytest.raises(TransactionalError):
                self.commit_group(sink, restarted, 3, [{"c": 3}, {"d": 4}])
        assert sink.read() == {"a": 1, "b": 2, "c": 3}

    def test_an_opaque_group_replay_undoes_the_earlier_write(
        self, sink: SinkUnderTest, grouped_opaque: CommitMode
    ) -> None:
        mode = grouped_opaque
        with self.opened(sink, mode) as committer:
            assert self.commit(sink, committer, 1, {"a": 1, "b": 2}) is CommitOutcome.APPLIED
            group = [{"a": 1, "c": 5}, {"b": 1, "d": 2}, {"a": 2}]
            assert self.commit_group(sink, committer, 2, group) is CommitOutcome.APPLIED
            assert sink.read() == {"a": 4, "b": 3, "c": 5, "d": 2}
        with self.opened(sink, mode) as restarted:  # the replay comes after a crash
            # Replayed with other batches: "c" and "d" are gone, txid 4 came out empty.
            replay: list[Mapping[str, int] | None] = [{"a": 2}, {"b": 4}, None]
            assert self.commit_group(sink, restarted, 2, replay) is CommitOutcome.REAPPLIED
            assert sink.read() == {"a": 3, "b": 6}
            assert self.commit(sink, restarted, 5, {"c": 1}) is CommitOutcome.APPLIED
        assert sink.read() == {"a": 3, "b": 6, "c": 1}
