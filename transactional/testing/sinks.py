"""The in-memory sink of the runner's unit tests, and the counting topology they run:
spout -> ``CountingBolt`` -> ``MemoryCommitter``s. ``MemoryCommitter`` keeps the
committer contract (``transactional.testing.committer_contract``) it stands in for."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from transactional.bolt import Bolt
from transactional.committer import Committer, CommitterContext
from transactional.errors import CommitError, FencedError
from transactional.topology import Topology, TopologyBuilder
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt


class CountingBolt(Bolt):
    """Counts each distinct row value: ``[(value, count), ...]``."""

    def process(self, attempt: TransactionAttempt, batch: list[Any]) -> list[tuple[Any, int]]:  # type: ignore[override]
        return sorted(Counter(batch).items(), key=repr)


# ---------------------------------------------------------------------- committer


class MemoryCommitter(Committer):
    """A key -> count sink following docs/design.md section 6 in both modes.

    Transactional mode keeps the last txid with the counts (and, under ``at_least_once``
    and ``at_most_once``, applies a txid it holds again: ``CommitterContext.checked``);
    opaque mode keeps (curr, prev, txid) per key and undoes every key of a replayed txid.
    """

    def __init__(
        self,
        mode: CommitMode = CommitMode.TRANSACTIONAL,
        fail: Callable[[TransactionAttempt], bool] | None = None,
    ) -> None:
        self.mode = mode  # type: ignore[misc]
        self.fail = fail
        self.last_txid = 0
        self.counts: dict[Any, int] = {}
        self.opaque: dict[Any, tuple[int, int | None, int]] = {}  # key -> (curr, prev, txid)
        self.calls: list[tuple[TransactionAttempt, CommitOutcome | None]] = []
        #: ``(first, last)`` of every commit group written (not skipped).
        self.groups: list[tuple[int, int]] = []
        #: ``(first, last)`` of every commit in ``calls`` (one txid: first == last).
        self.spans: list[tuple[int, int]] = []
        self.prepared: list[TransactionAttempt] = []
        #: Every txid whose rows were added to ``counts`` in transactional mode, each time
        #: (a txid twice: counted twice, as ``at_least_once`` allows after a crash).
        self.applied: list[int] = []
        self.context: CommitterContext | None = None
        #: The highest fence token that committed: a lower one is a deposed leader's.
        self.fence = 0

    def open(self, context: CommitterContext) -> None:
        self.context = context

    def prepare(self, attempt: TransactionAttempt, inputs: Mapping[str, Any]) -> Counter[Any]:
        self.prepared.append(attempt)
        total: Counter[Any] = Counter()
        for rows in inputs.values():
            for key, n in rows:
                total[key] += n
        return total

    def groupable(self, prepared: Any) -> bool:
        return True

    def commit(self, attempt: TransactionAttempt, prepared: Counter[Any]) -> CommitOutcome:
        return self.commit_group([attempt], [prepared])

    def commit_group(
        self, attempts: Sequence[TransactionAttempt], prepared: Sequence[Counter[Any] | None]
    ) -> CommitOutcome:
        attempt, first = attempts[-1], attempts[0].txid
        if self.fail is not None and any([self.fail(a) for a in attempts]):
            self.calls.append((attempt, None))
            self.spans.append((first, attempt.txid))
            raise CommitError(f"commit of {attempt} failed (injected)")
        token = None if self.context is None else self.context.fence_token
        if token is not None and token < self.fence:
            raise FencedError(
                f"the sink holds fence token {self.fence}, this runner's is {token}: another "
                "runner leads; nothing written"
            )
        self.fence = max(self.fence, token or 0)
        batch: Counter[Any] = Counter()
        for given in prepared:
            batch.update(given or {})
        outcome = (
            self._commit_opaque(first, attempt.txid, batch)
            if self.mode is CommitMode.OPAQUE
            else self._commit_transactional(first, attempt.txid, batch)
        )
        self.calls.append((attempt, outcome))
        self.spans.append((first, attempt.txid))
        if len(attempts) > 1 and outcome is not CommitOutcome.SKIPPED:
            self.groups.append((first, attempt.txid))
        return outcome

    def _commit_transactional(self, first: int, txid: int, batch: Counter[Any]) -> CommitOutcome:
        checked = self.context is None or self.context.checked
        if checked and txid <= self.last_txid:
            return CommitOutcome.SKIPPED
        if checked and first <= self.last_txid:
            raise CommitError(f"the sink holds txid {self.last_txid}, inside {first}..{txid}")
        for key, n in batch.items():
            self.counts[key] = self.counts.get(key, 0) + n
        self.last_txid = max(self.last_txid, txid)  # unchecked: applied again, never back
        self.applied.extend(range(first, txid + 1))
        return CommitOutcome.APPLIED

    def _commit_opaque(self, first: int, txid: int, batch: Counter[Any]) -> CommitOutcome:
        if txid < self.last_txid:
            raise CommitError(f"txid {txid} is older than the sink's {self.last_txid}")
        outcome = CommitOutcome.APPLIED
        for key, (_curr, prev, row_txid) in list(self.opaque.items()):
            if row_txid >= first:
                outcome = CommitOutcome.REAPPLIED
                if prev is None:
                    del self.opaque[key]
                else:
                    self.opaque[key] = (prev, None, 0)
        for key, n in batch.items():
            curr = self.opaque[key][0] if key in self.opaque else None
            self.opaque[key] = ((curr or 0) + n, curr, txid)
        self.last_txid = txid
        self.counts = {key: curr for key, (curr, _p, _t) in self.opaque.items()}
        return outcome

    def committed_txid(self) -> int | None:
        return self.last_txid or None

    def committed_sequence(self) -> list[int]:
        """The txids of every commit that returned, in order (a group's each)."""
        return [
            t
            for (first, last), (_, outcome) in zip(self.spans, self.calls, strict=True)
            if outcome is not None
            for t in range(first, last + 1)
        ]


def counting_topology(spout: Any, *committers: Committer) -> Topology:
    """``spout`` -> ``CountingBolt`` ("count") -> the committers, in order ("sink", or
    "sink0", "sink1", ... for several): the shape the runner's own tests use."""
    builder = TopologyBuilder().set_spout(spout).set_bolt("count", CountingBolt())
    for i, committer in enumerate(committers):
        builder.set_committer("sink" if len(committers) == 1 else f"sink{i}", committer, "count")
    return builder.build()


def expected_counts(records: Iterable[Any]) -> dict[Any, int]:
    """The answer a sink must hold: every record counted exactly once."""
    return dict(Counter(records))
