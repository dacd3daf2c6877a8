"""Run a user's topology in-process against a real store and sink, with a fault plan,
and run it again from the same store: "crash, rerun, assert" in two calls.

    harness = TopologyHarness(build, spark, topology_id="words", state_dir=tmp_path)
    first = harness.run_until_drained(FaultPlan().crash(FaultPoint.AFTER_SINK_WRITE, txid=2))
    assert first.crashed
    harness.run_until_drained()  # resumes: replays txid 2 from its stored metadata
    assert sink_contents() == expected

Every run is a new "process": ``build()`` is called again (new spout, new bolts, the
committers it returns), a new runner reads the store from scratch, attempt numbers
start again at 1. Whatever must outlive a crash (the sink's contents, the store) lives
outside the run: a real sink (Redis, Delta) or a sink object the test holds.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transactional import faults as _faults
from transactional.config import RunnerConfig
from transactional.faults import FaultPoint
from transactional.runner import RunStats, TransactionalRunner
from transactional.spark.engine import Engine
from transactional.store import StateStore, open_store
from transactional.testing.plan import FaultPlan, FaultPlanError, SimulatedCrash
from transactional.topology import Topology
from transactional.types import TransactionAttempt

__all__ = ["HarnessRun", "TopologyHarness", "UnmetFaultWarning"]


class UnmetFaultWarning(UserWarning):
    """A rule of a fault plan never fired: the test did not exercise what it names."""


#: Fast retries and polls: a test waits on little but the work itself. The back-off is
#: short but not zero: the runner sleeps until the next event or back-off deadline, and
#: with no deadline at all a retried start would wait for its idle timeout instead.
TEST_DEFAULTS: dict[str, Any] = {
    "backoff_initial_s": 0.01,
    "backoff_max_s": 0.01,
    "poll_interval_s": 0.05,
    "max_attempts": 10,
}


@dataclass
class HarnessRun:
    """What one ``run_until_drained`` did. ``crash`` is the planned crash that ended it,
    if one did; ``stats`` counts what this run committed before it ended."""

    stats: RunStats
    crash: SimulatedCrash | None = None
    injected: list[tuple[FaultPoint, int, int]] = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        return self.crash is not None


class TopologyHarness:
    """One topology id on one store, run to the end of its input as often as a test
    needs, each run optionally under a fault plan.

    ``store``: a store instance reused by every run (e.g. ``InMemoryStateStore``);
    default: the embedded SQLite store in ``state_dir`` (a fresh temporary directory if
    not given), reopened by every run as a restarted process would. ``engine`` replaces
    Spark for in-memory unit tests; otherwise ``spark`` is required. ``config`` sets
    ``RunnerConfig`` fields for every run (``run_until_drained`` can override them).

    A run that drains with rules of its ``FaultPlan`` that never fired (a txid that
    never came, an attempt that never happened) reports them: an ``UnmetFaultWarning``,
    or, with ``strict=True``, a ``FaultPlanError`` once the run has ended.
    """

    def __init__(
        self,
        build: Callable[[], Topology],
        spark: Any = None,
        *,
        topology_id: str = "test",
        state_dir: str | Path | None = None,
        store: StateStore | None = None,
        engine: Engine | None = None,
        strict: bool = False,
        **config: Any,
    ) -> None:
        if spark is None and engine is None:
            raise TypeError("give the harness a SparkSession (spark=...) or an engine=...")
        self.build = build
        self.spark = spark
        self.topology_id = topology_id
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.store = store
        self.engine = engine
        self.strict = strict
        self.config = {**TEST_DEFAULTS, **config}
        self.runs: list[HarnessRun] = []

    def run_until_drained(
        self, faults: _faults.FaultInjector | None = None, *, max_pending: int = 2, **config: Any
    ) -> HarnessRun:
        """Run until the spout has nothing more and everything is committed, or until a
        ``crash`` rule of ``faults`` fires (then ``result.crashed``; the store and sinks
        are left exactly as the crash found them). Any other error (``PoisonBatchError``
        after ``max_attempts``) propagates, after the run's threads have stopped."""
        settings = {**self.config, **config, "max_pending": max_pending}
        runner_config = RunnerConfig(topology_id=self.topology_id, **settings)
        life = _ProcessLife(faults)
        runner = TransactionalRunner(
            self.build(),
            self._open_store(),
            self.spark,
            runner_config,
            faults=life,
            engine=self.engine,
        )
        result = HarnessRun(runner.stats)
        try:
            runner.run(until_drained=True)
        except SimulatedCrash:
            result.crash = life.crash
        finally:
            runner.join()  # the next run must not overlap this one's threads
            result.injected = life.injected
            self.runs.append(result)
        if not result.crashed and isinstance(faults, FaultPlan):
            self._report_unmet(faults)
        return result

    def _report_unmet(self, plan: FaultPlan) -> None:
        """Only after a run that drained: a run that crashed may leave later rules to
        the run after it."""
        unmet = plan.unmet()
        if not unmet:
            return
        message = (
            "fault plan rules that never fired, so the test did not exercise them: "
            + "; ".join(unmet)
            + ". Check the txids and attempt numbers against the run (HarnessRun.injected)"
        )
        if self.strict:
            raise FaultPlanError(message)
        warnings.warn(message, UnmetFaultWarning, stacklevel=3)

    def _open_store(self) -> StateStore:
        if self.store is not None:
            return self.store
        if self.state_dir is None:
            self.state_dir = Path(tempfile.mkdtemp(prefix="transactional-harness-"))
        return open_store(None, str(self.state_dir))


class _ProcessLife:
    """The plan as one run's "process" sees it: once a crash fired, every later step
    of any thread of this run meets the crash too, since a killed process takes no
    further step. A new run is a new life."""

    def __init__(self, plan: _faults.FaultInjector | None) -> None:
        self.plan = plan
        self.crash: SimulatedCrash | None = None
        self.injected: list[tuple[FaultPoint, int, int]] = []

    def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        if self.crash is not None:
            raise SimulatedCrash(point, attempt.txid, number, echo=True)
        if self.plan is None:
            return
        try:
            self.plan.check(point, attempt, number)
        except SimulatedCrash as crash:
            self.crash = crash
            self.injected.append((point, attempt.txid, number))
            raise
        except Exception:
            self.injected.append((point, attempt.txid, number))
            raise
