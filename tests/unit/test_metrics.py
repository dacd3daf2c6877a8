"""The run's Prometheus metrics (``transactional.runtime.metrics``), fed the messages a
run produces: each series holds what those messages say, read back from the registry
as a scrape would."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry

from transactional.errors import InjectedFault
from transactional.runtime import messages as m
from transactional.runtime.metrics import Metrics
from transactional.types import CommitOutcome, TransactionAttempt


def test_the_series_count_what_the_run_did() -> None:
    registry = CollectorRegistry()
    lag: list[int | None] = [None]
    metrics = Metrics(
        "orders", ["redis", "delta"], registry, lag=lambda: lag[0], batch_size=lambda: 500
    )
    one, two = TransactionAttempt(1, 11), TransactionAttempt(2, 12)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"topology": "orders", **labels})

    assert value("transactional_txids_committed_total") == 0
    assert value("transactional_commit_outcomes_total", committer="delta", outcome="skipped") == 0
    metrics.on_event(m.Started(one), 0)
    metrics.on_command(m.Emit(one, 1), 0)
    metrics.on_event(m.Started(two), 0)
    assert value("transactional_in_flight") == 2
    metrics.on_measure(one, "emit", 0.3)
    metrics.on_measure(one, "commit", 0.02)
    metrics.on_outcomes(one, [CommitOutcome.APPLIED, CommitOutcome.SKIPPED])
    metrics.on_command(m.Acknowledge(one, 1, 1200, 0.0), 0)
    metrics.on_command(m.Backoff(2, InjectedFault("x"), m.Phase.PROCESS, 1, 5.0), 0)
    metrics.on_command(m.Cancel(two, True), 0)

    assert value("transactional_txids_committed_total") == 1
    assert value("transactional_records_committed_total") == 1200
    assert value("transactional_commit_outcomes_total", committer="redis", outcome="applied") == 1
    assert value("transactional_commit_outcomes_total", committer="delta", outcome="skipped") == 1
    assert value("transactional_commit_outcomes_total", committer="delta", outcome="applied") == 0
    assert value("transactional_retries_total") == 1
    assert value("transactional_failures_total", cause="InjectedFault") == 1
    assert value("transactional_step_seconds_count", step="emit") == 1
    assert value("transactional_step_seconds_sum", step="emit") == 0.3
    assert value("transactional_step_seconds_bucket", step="commit", le="0.025") == 1
    assert value("transactional_txid_records_bucket", le="1000.0") == 0
    assert value("transactional_txid_records_bucket", le="10000.0") == 1
    assert value("transactional_in_flight") == 0
    assert value("transactional_batch_size") == 500
    assert math.isnan(value("transactional_lag") or 0.0)
    lag[0] = 77
    assert value("transactional_lag") == 77
