"""The committer plug-in interface: where results go, idempotently and in txid order."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from transactional.types import CommitMode, CommitOutcome, Guarantee, TransactionAttempt

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from transactional.lineage import Dataset


@dataclass(frozen=True)
class Rollback:
    """How a committer rolls its sink back to a txid (``Committer.rollback``): ``steps``
    say what ``apply`` will do, for people; ``apply`` does it, and doing it again after
    a crash half-way is safe (it brings every part of the sink to the txid once)."""

    steps: list[str]
    apply: Callable[[], None]


def _leads() -> None:
    """The leadership check of a context built outside a runner: nothing to check."""


@dataclass(eq=False)
class CommitterContext:
    """What the runner tells a committer at ``open``.

    ``fence_token`` is the state store's token of the runner's current leadership
    (``StateStore.fence_token``; None if the store has none). The runner raises it in
    place when it re-acquires leadership, before any commit under the new leadership.
    A sink that can compare it atomically with its write stores it with each commit and
    refuses a lower token with ``FencedError`` (``RedisCommitter`` does, in its script):
    then a deposed leader that wakes up in the middle of a commit writes nothing.

    ``check_leadership`` raises ``LostLeadershipError`` unless the runner still leads;
    it is safe to call from the commit thread. ``DeltaCommitter`` calls it right before
    each write, and fences by token as well: each leadership claims a table with its
    token before writing it, and a write checks the table's token (see
    ``committers.delta``).
    """

    spark: SparkSession | None
    topology_id: str
    name: str
    fence_token: int | None = None
    check_leadership: Callable[[], None] = _leads
    #: The run's guarantee. Under ``at_least_once`` and ``at_most_once`` a
    #: transactional-mode commit is written without the last-txid check: a txid the sink
    #: already holds is applied again (the marker still moves, never back). Opaque mode
    #: keeps its undo, which is what lets it take a replay that differs.
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    #: Overlapping commits (``Committer.overlapping_commits``, under ``at_least_once``):
    #: the txid below which every sink holds every txid (the store's ``currtx``), read
    #: at each commit. None: commits run one at a time, in txid order.
    settled: Callable[[], int] | None = None

    @property
    def checked(self) -> bool:
        """Whether a commit checks the sink's last txid (``exactly_once``)."""
        return self.guarantee is Guarantee.EXACTLY_ONCE

    @property
    def writer_note(self) -> str | None:
        """What a commit of this leadership says of its writer, for a sink that keeps a
        note with each commit (Delta's ``commitInfo.userMetadata``): ``{"fence": N}``,
        the fence token; None without one. ``noted_fence`` reads it back."""
        return None if self.fence_token is None else json.dumps({"fence": self.fence_token})


def noted_fence(note: str | None) -> int | None:
    """The fence token in a commit's writer note (``CommitterContext.writer_note``);
    None for a note that is not one."""
    try:
        parsed = json.loads(note or "null")
    except ValueError:
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get("fence"), int):
        return int(parsed["fence"])
    return None


class Committer(ABC):
    """Writes the results of one txid to a sink, atomically, recording the txid with them.

    The runner guarantees: ``prepare`` runs once per attempt, possibly in parallel with
    other txids' ``prepare`` and with ``commit`` of a lower txid; ``commit`` runs for
    one txid at a time, in strictly increasing txid order with no gap, except that a
    txid is committed again (same or new attempt) after a failure or restart, and that
    a committer whose ``overlapping_commits()`` says yes may, under ``at_least_once``,
    see commits of the txids after one running start on other threads before it ends. The
    runner's warm-up also prepares an attempt of txid 0 that is never committed, so
    ``prepare`` must not write to the sink.

    The implementation must guarantee (docs/design.md section 6), under ``exactly_once``
    (``CommitterContext.guarantee`` says when a transactional-mode commit skips the check):

    - transactional mode: the sink keeps the last committed txid in the same atomic
      write as the data; a commit of ``txid <= last`` changes nothing and returns
      ``CommitOutcome.SKIPPED``;
    - opaque mode: committing ``txid == last`` first undoes everything the earlier
      attempt of that txid wrote, then applies; ``txid < last`` is a ``CommitError``.

    Commit groups (optional, ``groupable`` and ``commit_group``): the runner may commit
    consecutive txids ``first..last`` as one write marked with ``last``. It records the
    group in its store first and, until the group is committed, commits exactly that
    group again, so the sink only ever holds ``last`` for the whole group or a txid
    below ``first``. The rules above then read: transactional mode skips a group whose
    ``last`` the sink holds; opaque mode undoes the earlier write of a group when the
    sink holds a txid at or above ``first`` (only a write starting at ``first`` can
    have put it there, since ``first`` is the state store's ``currtx``).
    """

    mode: ClassVar[CommitMode] = CommitMode.TRANSACTIONAL
    #: The guarantees this committer can give (``RunnerConfig.guarantee``;
    #: ``transactional.guarantees``): all, for a committer that keeps the rules above. A
    #: sink whose writes are not idempotent per txid (a message sent, a plain append)
    #: says ``frozenset({Guarantee.AT_LEAST_ONCE, Guarantee.AT_MOST_ONCE})``, and a run
    #: asking it for ``exactly_once`` is refused before it starts.
    guarantees: ClassVar[frozenset[Guarantee]] = frozenset(Guarantee)
    #: ``collect_plan`` builds the same plans for every attempt whose inputs have the
    #: same schemas (it does not use ``attempt``): see ``Bolt.plan_once``.
    plan_once: ClassVar[bool] = False

    def input_names(self) -> frozenset[str] | None:
        """The input names this committer reads, as ``TopologyBuilder.set_committer``
        must wire them (``inputs={name: stream}``); None: any names. ``build()`` refuses
        a wiring whose names differ, before anything runs."""
        return None

    def spark_conf(self) -> Mapping[str, str]:
        """Spark settings this committer needs on the runner's session (Delta's jars and
        extensions, say). ``transactional run`` merges every committer's settings into
        the session it creates; user settings (``--conf``) win."""
        return {}

    def lineage_datasets(self) -> Sequence[Dataset]:
        """What this committer writes, as OpenLineage names datasets
        (``transactional.lineage``), for the run events ``RunnerConfig.lineage`` sends.
        Default: none named."""
        return ()

    def preflight(self) -> None:  # noqa: B027 - optional hook
        """Check, within a few seconds and changing nothing, that the sink can be reached
        (a server answers, a directory can be written), before Spark starts: the
        commands call it on a topology built without Spark, so that an unreachable sink
        is one line at once, not an error after the JVM's start. Raise
        ``ConfigurationError`` naming what to fix. ``open`` still checks everything."""

    def open(self, context: CommitterContext) -> None:  # noqa: B027 - optional hook
        """Called once before the first ``prepare``; check the sink is usable here so that
        bad configuration fails at start."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Called once when the runner stops."""

    def prepare(self, attempt: TransactionAttempt, inputs: Mapping[str, DataFrame]) -> Any:
        """Turn the attempt's input streams into what ``commit`` writes. Runs in the
        parallel phase, so heavy Spark work belongs here. Default: materialise each
        input once, so the rows cannot change between prepare and commit."""
        from transactional.spark.checkpoints import checkpoint

        return {name: checkpoint(df, eager=True) for name, df in inputs.items()}

    def collect_plan(
        self, attempt: TransactionAttempt, inputs: Mapping[str, DataFrame]
    ) -> Mapping[str, DataFrame]:
        """Frames this committer wants on the driver as Arrow (per-key sums, small
        tables). The runner collects every committer's frames of an attempt together
        (``Engine.collect``), and hands each its own through ``prepare_collected``
        instead of calling ``prepare``. Default: none, and ``prepare`` is called as usual. A frame should be
        cut (``limit``) at what the driver can hold."""
        return {}

    def prepare_collected(
        self,
        attempt: TransactionAttempt,
        inputs: Mapping[str, DataFrame],
        collected: Mapping[str, pa.Table],
    ) -> Any:
        """``prepare``, given ``collect_plan``'s frames as Arrow tables by the same names.
        Default: ``prepare(attempt, inputs)``."""
        return self.prepare(attempt, inputs)

    @abstractmethod
    def commit(self, attempt: TransactionAttempt, prepared: Any) -> CommitOutcome:
        """Write ``prepared`` for ``attempt.txid`` atomically with the txid. Raise
        ``FencedError`` (writing nothing) if the sink holds a higher fence token than
        ``context.fence_token``: another runner leads now."""

    def overlapping_commits(self) -> bool:
        """Whether, under ``at_least_once``, commits of different txids may run at once:
        the runner then sends up to ``max_pending`` of them without waiting for the one
        before, and the store still moves past them in txid order. Say yes only when
        commits applied in any order leave the sink as they would in txid order (sums of
        integers or decimals, minimums, maximums: not a last value, not a double sum,
        whose rounding depends on the order) and the txid the sink keeps stays the end
        of an unbroken run from the first (``CommitterContext.settled`` says where the
        run stands). Default False."""
        return False

    def groupable(self, prepared: Any) -> bool:
        """Whether the attempt whose ``prepare`` gave ``prepared`` may be committed in a
        group with the txids beside it (``commit_group``). Default False: every txid is
        committed alone (``max_group`` has no effect)."""
        return False

    def commit_group(
        self, attempts: Sequence[TransactionAttempt], prepared: Sequence[Any]
    ) -> CommitOutcome:
        """Write the txids of ``attempts`` (two or more, consecutive, in order; their
        ``prepared`` beside them, ``None`` for a txid that came out empty) as one atomic
        write, marked with the last txid; the same duties as ``commit`` (see the class),
        for the group. Called only with attempts ``groupable`` said yes to, except when
        a recorded group is committed again after a failure or a restart: then it must
        also cope with prepared results it would not have grouped."""
        raise NotImplementedError(f"{type(self).__name__} does not commit groups")

    def committed_txid(self) -> int | None:
        """The last txid the sink holds (None if none or unknown).

        When ``commit`` raises, its write may still have been applied (a reply lost to
        a timeout or a dropped connection). The runner then asks this: if the sink holds
        the txid it is not committed again (nor counted as failed); otherwise it is
        replayed. So this must read the sink itself, never a value cached by ``commit``.
        Called from the commit thread; the default (None) makes every failed commit
        a replay, which an idempotent sink makes exact anyway."""
        return None

    def sink_marker(self, topology_id: str, name: str) -> int | None:
        """The last txid the sink holds for this committer, named ``name`` in topology
        ``topology_id``, read without opening the committer and without writing
        anything: what ``transactional status`` shows beside the store's ``currtx``.
        None: the sink holds none. Raises ``NotImplementedError`` (the default) when the
        committer cannot tell, and ``CommitError`` when the sink cannot be read."""
        raise NotImplementedError(f"{type(self).__name__} does not say what its sink holds")

    def state_names(self) -> list[str]:
        """The names of the aggregate states this committer keeps and can read back by
        key (``state``): what ``transactional query`` looks among. Default: none."""
        return []

    def state(self, name: str) -> Any:
        """A reader of the state ``name`` (``committers.states.StateReader``: ``get(keys)``
        gives the values it holds, in order, None for none), usable without ``open``.
        Raises ``ConfigurationError`` for a name it does not keep."""
        from transactional.errors import ConfigurationError

        raise ConfigurationError(f"{type(self).__name__} keeps no state {name!r}")

    def rollback(self, topology_id: str, name: str, txid: int) -> Rollback:
        """How to bring this committer's sink (named ``name`` in ``topology_id``) back to
        what it held when ``txid`` was committed (0: before the first), for
        ``transactional rewind``; with no open and nothing written until ``apply``.
        Raises ``ConfigurationError`` saying why when the sink cannot roll back to it
        (the default: a sink without history)."""
        from transactional.errors import ConfigurationError

        raise ConfigurationError(
            f"{type(self).__name__} cannot roll its sink back to an earlier txid: "
            "`transactional rewind` needs sinks that keep their history (Delta tables)"
        )
