"""The latency benchmark's verdicts (``benchmarks.latency``): a count that is not what
was produced is never reported exact, and the percentiles are nearest-rank."""

from __future__ import annotations

import pytest

from benchmarks.latency import STRUCTURED_STREAMING, LatencyResult, Produced, _check


def produced(counts: dict[int, int]) -> Produced:
    out = Produced()
    for bucket, events in counts.items():
        out.add(bucket, events)
    return out


@pytest.mark.parametrize(
    ("held", "dead", "verdict"),
    [
        ({1: 10, 2: 5}, 0, "exact"),
        ({1: 10, 2: 4}, 0, "1 events lost"),
        ({1: 11, 2: 5}, 0, "1 events counted twice"),
        ({1: 9, 2: 6}, 0, "1 events lost; 1 events counted twice"),
        ({1: 10, 2: 5, 7: 3}, 0, "1 buckets never produced (3 events)"),
        ({1: 10}, 0, "5 events lost"),
        ({1: 10, 2: 5}, 2, "2 dead letters"),
    ],
)
def test_every_difference_from_the_produced_counts_is_named(
    held: dict[int, int], dead: int, verdict: str
) -> None:
    result = LatencyResult(STRUCTURED_STREAMING)
    _check(held, produced({1: 10, 2: 5}), dead, result)
    assert result.exact == verdict


def test_undelivered_events_are_not_exact() -> None:
    sent = produced({1: 10})
    sent.delivered(RuntimeError("broker down"), None)
    result = LatencyResult(STRUCTURED_STREAMING)
    _check({1: 10}, sent, 0, result)
    assert result.exact == "1 events not delivered to Kafka"


def test_percentiles_are_nearest_rank() -> None:
    result = LatencyResult(STRUCTURED_STREAMING, latencies_ms=[float(n) for n in range(1, 101)])
    assert [result.percentile(q) for q in (0.5, 0.9, 0.99, 1.0)] == [50.0, 90.0, 99.0, 100.0]
    assert LatencyResult(STRUCTURED_STREAMING).percentile(0.5) is None
