"""``TransactionalRunner``: opens the store and takes the leadership, wires the runtime
(the state machine, its executor, the spout's driver, the probes) and runs it until it
is stopped, drained or halted. The protocol it runs: docs/architecture.md, "The
protocol".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from transactional import contracts
from transactional.committer import Committer
from transactional.config import RunnerConfig
from transactional.errors import ConfigurationError
from transactional.faults import FaultInjector
from transactional.flow import AdaptiveBatchSize
from transactional.guarantees import check_guarantee
from transactional.runtime.drivers import DRIVERS
from transactional.runtime.executor import Executor
from transactional.runtime.leadership import LeaderSession
from transactional.runtime.ledger_plan import announce
from transactional.runtime.lineage import Lineage
from transactional.runtime.machine import Machine
from transactional.runtime.messages import Opened
from transactional.runtime.probes import (
    Faults,
    Logs,
    Outcomes,
    Probe,
    RunListener,
    RunStats,
    Timings,
    TxTiming,
)
from transactional.runtime.quiet import quietly
from transactional.runtime.settle import opened
from transactional.runtime.status import Status
from transactional.runtime.warmup import warm_up
from transactional.spark.engine import Engine, engine_for
from transactional.spout import SpoutContext
from transactional.store import StateStore, TopologyIdentity
from transactional.topology import SPOUT, Topology
from transactional.types import Guarantee

__all__ = ["RunListener", "RunStats", "TransactionalRunner", "TxTiming"]

log = logging.getLogger("transactional.runner")


class TransactionalRunner:
    """Runs one topology against one state store until stopped or drained.

    A facade over ``transactional.runtime``: the pure state machine (``machine``), the
    spout driver of the topology's kind (``drivers``), the leadership session
    (``leadership``), the executor that carries the machine's commands out on Spark and
    threads (``executor``, with ``commit``) and the probes that watch it (``probes``).
    """

    def __init__(
        self,
        topology: Topology,
        store: StateStore,
        spark: Any = None,
        config: RunnerConfig | None = None,
        *,
        faults: FaultInjector | None = None,
        listener: RunListener | None = None,
        engine: Engine | None = None,
        clock: Callable[[], float] = time.monotonic,
        batch_size: AdaptiveBatchSize | int | None = None,
    ) -> None:
        if config is None:
            raise TypeError("config is required: RunnerConfig(topology_id=...)")
        check_guarantee(topology, config.guarantee)
        if engine is None:
            if spark is None:
                raise TypeError("a SparkSession (spark=...) or an engine is required")
            engine = engine_for(spark)
        self.topology = topology
        self.store = store
        self.config = config
        self.engine = engine
        self.faults = faults
        self.listener = listener
        self.clock = clock
        #: Sizes of new txids: flow control (``--batch-size auto``), a fixed size the spout
        #: reads through ``SpoutContext.batch_size`` (``--batch-size N``), or None: its own.
        self._sizing = batch_size
        self.stats = RunStats()
        self._stop = threading.Event()
        self._executor: Executor | None = None
        self._status: Status | None = None
        self._metrics_server: Any = None
        self._lineage: Lineage | None = None
        self._context: SpoutContext | None = None

    def stop(self) -> None:
        """Ask the runner to stop after the step it is in; safe from any thread."""
        self._stop.set()
        if self._executor is not None:
            self._executor.wake()

    def join(self) -> None:
        """Wait until the last run's worker and commit threads have stopped. ``run``
        returns at once on an error, while they may still be finishing a step (a commit
        is never cut short); a new run of the same topology in this process must not
        overlap them, as a restarted process never overlaps a killed one."""
        if self._executor is not None:
            self._executor.join()

    @property
    def _adaptive(self) -> AdaptiveBatchSize | None:
        """The flow control sizing new txids, under ``--batch-size auto``."""
        return self._sizing if isinstance(self._sizing, AdaptiveBatchSize) else None

    @property
    def warms_up(self) -> bool:
        """Whether a run warms up first (``RunnerConfig.warm_up``; by default only for
        adaptive batch sizes, which the first txids' latency would mislead)."""
        if self.config.warm_up is None:
            return self._adaptive is not None
        return self.config.warm_up

    def run(self, until_drained: bool = False) -> RunStats:
        """Run until ``stop()``, or, with ``until_drained``, until ``is_ready`` says no
        with nothing in flight and everything committed."""
        executor, first = self._open()
        try:
            if self.warms_up:
                warm_up(
                    executor.pipeline,
                    self.topology,
                    self.config.topology_id,
                    f"warm-up-run-{executor.run}",
                    self.config.attempt_timeout_s,
                    self._stop.is_set,
                )
            executor.feed(first)
            while not self._stop.is_set():
                if executor.turn(until_drained):
                    break
        finally:
            self._close(executor)
        return self.stats

    def _open(self) -> tuple[Executor, Opened]:
        cfg = self.config
        spout = self.topology.spout
        kind = self.topology.kind
        # Before anything is touched: the bolts the ledger cannot check, said once here,
        # or refused with ledger_strict.
        announce(self.topology, cfg.ledger, cfg.ledger_strict)
        self.store.open(cfg.topology_id)
        self.store.register(TopologyIdentity(spout.identity(), kind.value))
        session = LeaderSession(
            self.store, cfg.topology_id, cfg.leader_timeout_s, self._stop, self.clock
        )
        state = session.acquire()
        if state.rewinding is not None:
            raise ConfigurationError(
                f"topology {cfg.topology_id!r} is being rewound to txid {state.rewinding} "
                "and the rewind did not finish: run `transactional rewind ... --to "
                f"{state.rewinding}` again to finish it before running the topology"
            )
        faults = Faults(self.faults)
        driver = DRIVERS[kind](
            spout,
            contracts.component("spout", SPOUT, spout),
            self.store,
            self.engine,
            faults.check,
            cfg.check_determinism,
            cfg.guarantee,
        )
        stored = driver.load(state)
        machine = Machine(cfg, overlap=self._overlap(cfg))
        log.info(
            "runner started topology=%s currtx=%d replays=%s max_pending=%d fence=%s "
            "guarantee=%s commits_at_once=%d",
            cfg.topology_id,
            state.currtx,
            sorted(t for t in stored if t >= state.currtx),
            cfg.max_pending,
            session.token,
            cfg.guarantee,
            machine.overlap,
        )
        if cfg.guarantee is Guarantee.AT_MOST_ONCE:
            self._warn_unknown_sinks()
        if cfg.start_from is not None:
            self._check_start_from(spout, state)
        self._context = SpoutContext(
            self.engine.spark, cfg.topology_id, self._sizing, cfg.start_from
        )
        spout.open(self._context)
        settled = (lambda: machine.currtx) if machine.overlap > 1 else None
        for node in self.topology.committers:
            context = session.context(self.engine.spark, node.name, cfg.guarantee, settled)
            node.committer.open(context)
        probes: list[Probe] = [Timings(self.stats, self._adaptive), Logs()]
        if cfg.status_interval_s > 0:
            self._status = Status(
                cfg.topology_id,
                self._publish,
                self.stats,
                lag=spout.lag,
                batch_size=self._current_size,
                fence=lambda: session.token,
                interval_s=cfg.status_interval_s,
                guarantee=cfg.guarantee,
                previous=self.store.read_status,
            )
            probes.append(self._status)
        if cfg.metrics_port is not None:
            probes.append(self._serve_metrics(cfg, spout))
        if cfg.lineage:
            outputs = [d for n in self.topology.committers for d in n.committer.lineage_datasets()]
            self._lineage = Lineage(
                cfg.topology_id, spout.lineage_datasets(), outputs, driver.stored_meta
            )
            probes.append(self._lineage)
        executor = Executor(
            self.topology,
            machine,
            driver,
            session,
            self.engine,
            faults,
            probes,
            Outcomes(self.stats, self.listener),
            self.stats,
            self._stop,
            self.clock,
        )
        self._executor = executor
        return executor, opened(driver, self.topology.committers, state, stored, cfg.guarantee)

    def _overlap(self, cfg: RunnerConfig) -> int:
        """How many commits may run at once: ``max_pending`` under ``at_least_once`` when
        every committer says its commits may overlap, else one at a time."""
        committers = [node.committer for node in self.topology.committers]
        if cfg.guarantee is not Guarantee.AT_LEAST_ONCE or not committers:
            return 1
        return cfg.max_pending if all(c.overlapping_commits() for c in committers) else 1

    def _warn_unknown_sinks(self) -> None:
        """``at_most_once`` tells what a restart dropped by what the sinks hold: a
        committer that cannot say over-reports (``runtime.settle``)."""
        for node in self.topology.committers:
            if type(node.committer).committed_txid is Committer.committed_txid:
                log.warning(
                    "committer %r cannot say which txid its sink holds (committed_txid): a "
                    "restart reports every txid in flight at the stop as dropped, though "
                    "its sink may hold some",
                    node.name,
                )

    def _check_start_from(self, spout: Any, state: Any) -> None:
        """``--start-from`` positions a new topology: refused where it would be ignored."""
        who = f"--start-from {self.config.start_from!r}"
        if not getattr(spout, "accepts_start_from", False):
            raise ConfigurationError(
                f"{who}: the spout {spout.identity()} does not read a start position "
                "(SpoutContext.start_from); set its start in the topology instead"
            )
        if state.currtx > 1 or state.metas:
            raise ConfigurationError(
                f"{who}: topology {self.config.topology_id!r} has already started (currtx "
                f"{state.currtx}), and a start position only applies to a new topology: "
                "run it without --start-from to go on, or give a new --topology-id"
            )

    def _serve_metrics(self, cfg: RunnerConfig, spout: Any) -> Probe:
        from prometheus_client import CollectorRegistry

        from transactional.runtime.metrics import Metrics, serve

        registry = CollectorRegistry()
        probe = Metrics(
            cfg.topology_id,
            [node.name for node in self.topology.committers],
            registry,
            lag=spout.lag,
            batch_size=self._current_size,
            guarantee=cfg.guarantee,
        )
        assert cfg.metrics_port is not None
        try:
            self._metrics_server = serve(registry, cfg.metrics_port, cfg.metrics_host)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {cfg.metrics_host}:{cfg.metrics_port} ({exc}): "
                "choose a free --metrics-port"
            ) from exc
        log.info("metrics at http://%s:%d/metrics", cfg.metrics_host, cfg.metrics_port)
        return probe

    def _current_size(self) -> int | None:
        sizing = self._sizing
        if isinstance(sizing, AdaptiveBatchSize):
            return sizing.current
        if sizing is None and self._context is not None:
            return self._context.last_batch_size  # the spout's own, once it asked
        return sizing

    def _publish(self, document: dict[str, Any]) -> None:
        """The status document to the store; a failure to write a report must not stop
        the run (the store's own writes fail loudly on their own)."""
        try:
            self.store.publish_status(document)
        except Exception as exc:  # a report is best effort
            log.debug("status not published error=%s: %s", type(exc).__name__, exc)

    def _close(self, executor: Executor) -> None:
        if self._status is not None:
            self._status.finish()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        executor.close()
        if self._lineage is not None:  # after the executor: its last events are queued
            self._lineage.close()
            self._lineage = None
        for node in self.topology.committers:
            quietly(node.committer.close, "committer close")
        quietly(self.topology.spout.close, "spout close")
        quietly(self.store.close, "store close")
