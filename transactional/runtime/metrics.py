"""Prometheus metrics of a run (``transactional run --metrics-port N``): a probe that
counts what the run does, into its own registry, served over HTTP while the run lasts.

Every series carries the ``topology`` label. Counters: ``transactional_txids_committed``,
``transactional_records_committed``, ``transactional_commit_outcomes`` (per committer
and outcome: ``applied``, ``skipped`` for a replay the sink already held, ``reapplied``
for an opaque replay redone), ``transactional_retries``, ``transactional_failures``
(per cause: the exception's class). Histograms: ``transactional_step_seconds`` (per
protocol step), ``transactional_txid_records`` (records per committed txid). Gauges,
read when scraped: ``transactional_batch_size``, ``transactional_lag`` (NaN when the
spout cannot tell), ``transactional_in_flight``, ``transactional_guarantee`` (1, with the
run's guarantee as a label). Under ``at_most_once``: ``transactional_txids_dropped`` and
``transactional_records_dropped`` (the records of dropped txids that were counted before
they failed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from transactional.runtime import messages as m
from transactional.runtime.probes import Probe
from transactional.types import CommitOutcome, Guarantee, TransactionAttempt

__all__ = ["Metrics", "serve"]

#: Seconds per step: from a cheap store write to a txid of minutes.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: Records per txid: from a handful to millions.
RECORD_BUCKETS = tuple(float(10**e) for e in range(0, 8))


class Metrics(Probe):
    """The run's metrics in ``registry``; ``committers``: the committers' names, in the
    order their outcomes are reported."""

    def __init__(
        self,
        topology_id: str,
        committers: Sequence[str],
        registry: CollectorRegistry,
        lag: Callable[[], int | None] = lambda: None,
        batch_size: Callable[[], int | None] = lambda: None,
        guarantee: Guarantee = Guarantee.EXACTLY_ONCE,
    ) -> None:
        self.topology_id = topology_id
        self.committers = list(committers)
        self.registry = registry
        t = ["topology"]
        self.txids = Counter(
            "transactional_txids_committed", "Txids committed by this run", t, registry=registry
        )
        self.records = Counter(
            "transactional_records_committed",
            "Records of the txids committed",
            t,
            registry=registry,
        )
        self.outcomes = Counter(
            "transactional_commit_outcomes",
            "What each committer did with each committed txid",
            [*t, "committer", "outcome"],
            registry=registry,
        )
        self.retries = Counter(
            "transactional_retries", "Failed attempts that will be retried", t, registry=registry
        )
        self.failures = Counter(
            "transactional_failures", "Failed attempts, by cause", [*t, "cause"], registry=registry
        )
        self.dropped_txids = Counter(
            "transactional_txids_dropped",
            "Txids dropped under at_most_once: failed, never retried",
            t,
            registry=registry,
        )
        self.dropped_records = Counter(
            "transactional_records_dropped",
            "Records of the dropped txids, where counted before they failed",
            t,
            registry=registry,
        )
        Gauge(
            "transactional_guarantee",
            "The run's guarantee (its label); always 1",
            [*t, "guarantee"],
            registry=registry,
        ).labels(topology_id, guarantee.value).set(1)
        self.steps = Histogram(
            "transactional_step_seconds",
            "Seconds per protocol step of an attempt",
            [*t, "step"],
            buckets=STEP_BUCKETS,
            registry=registry,
        )
        self.txid_records = Histogram(
            "transactional_txid_records",
            "Records per committed txid",
            t,
            buckets=RECORD_BUCKETS,
            registry=registry,
        )
        self._in_flight: set[int] = set()  # read by the scrape's thread: replaced, never changed
        gauges = {
            "transactional_batch_size": ("Records of a new txid", batch_size),
            "transactional_lag": ("How far the source is ahead of the last txid", lag),
            "transactional_in_flight": ("Txids in flight", lambda: len(self._in_flight)),
        }
        for name, (text, read) in gauges.items():
            Gauge(name, text, t, registry=registry).labels(topology_id).set_function(_reader(read))
        for name in self.committers:  # every outcome is a series from the start, at 0
            for outcome in CommitOutcome:
                self.outcomes.labels(topology_id, name, outcome.value)
        self.txids.labels(topology_id)
        self.records.labels(topology_id)
        self.retries.labels(topology_id)
        self.dropped_txids.labels(topology_id)
        self.dropped_records.labels(topology_id)

    def on_event(self, event: m.Event, now: float) -> None:
        if isinstance(event, m.Started):
            self._in_flight = self._in_flight | {event.attempt.txid}
        elif isinstance(event, m.Opened) and event.dropped:
            self.dropped_txids.labels(self.topology_id).inc(len(event.dropped))

    def on_command(self, command: m.Command, now: float) -> None:
        tid = self.topology_id
        match command:
            case m.Emit(attempt) | m.Replay(attempt):
                self._in_flight = self._in_flight | {attempt.txid}
            case m.Acknowledge(attempt, _, records, _):
                self._in_flight = self._in_flight - {attempt.txid}
                self.txids.labels(tid).inc()
                self.records.labels(tid).inc(records)
                self.txid_records.labels(tid).observe(records)
            case m.Retract(attempt):
                self._in_flight = {t for t in self._in_flight if t < attempt.txid}
            case m.Cancel(attempt):
                self._in_flight = self._in_flight - {attempt.txid}
            case m.Skip(attempt, _, records, in_sink):
                self._in_flight = self._in_flight - {attempt.txid}
                if in_sink:  # committed; only the store's advance had failed
                    self.txids.labels(tid).inc()
                    self.records.labels(tid).inc(records or 0)
                else:
                    self.dropped_txids.labels(tid).inc()
                    self.dropped_records.labels(tid).inc(records or 0)
            case m.Drop(_, _, error, _):
                self.failures.labels(tid, type(error).__name__).inc()
            case m.Backoff(_, error, _, _):
                self.retries.labels(tid).inc()
                self.failures.labels(tid, type(error).__name__).inc()
            case m.Halt(_, error, _, _, _):
                self.failures.labels(tid, type(error).__name__).inc()

    def on_measure(self, attempt: TransactionAttempt, step: str, seconds: float) -> None:
        self.steps.labels(self.topology_id, step).observe(seconds)

    def on_outcomes(self, attempt: TransactionAttempt, outcomes: Sequence[CommitOutcome]) -> None:
        for name, outcome in zip(self.committers, outcomes, strict=False):
            self.outcomes.labels(self.topology_id, name, outcome.value).inc()


def _reader(read: Callable[[], int | None]) -> Callable[[], float]:
    def value() -> float:
        got = read()
        return math.nan if got is None else float(got)

    return value


def serve(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> Any:
    """Serve ``registry`` at ``http://host:port/metrics``; returns the server, whose
    ``shutdown()`` stops it."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
