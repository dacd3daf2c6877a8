"""Random inputs, spout kinds, sinks, batch sizes, fault seeds and ``max_pending``
through the whole demo on real services (Spark, SQLite store, Redis or Delta sink),
checked against the independent reference counts: a few examples, since each is a full
run on Spark, and every spout kind and both sinks in every run of the suite.

The tweets come from the demo's generator under a drawn seed, so even Hypothesis's
first (simplest) example holds the tokens that trip naive counters."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from examples.tweets.cli import main as demo
from examples.tweets.generate import generate
from tests.history import assert_exact, read_delta, read_redis
from tests.processes import run_summary
from tests.reference import expected_counts
from transactional.faults import RandomFaults

pytestmark = pytest.mark.integration

FAIL_RATE = 0.2


def failing_seed(start: int) -> int:
    """The first seed from ``start`` whose faults fail the first attempt of txid 1, so
    every example meets at least one failure."""
    return next(s for s in range(start, start + 1000) if RandomFaults(FAIL_RATE, s).planned(1, 1))


#: One explicit example per spout kind, between them both sinks, so that every run of
#: the suite covers each; Hypothesis then adds a drawn one (any kind, any sink) and, on
#: a failure, shrinks it.
COVERING = [
    dict(spout="opaque", sink="delta", partitions=3, bad_rate=0.1, batch_size=12, max_pending=4),
    dict(
        spout="partitioned", sink="redis", partitions=2, bad_rate=0.0, batch_size=9, max_pending=2
    ),
    dict(
        spout="transactional",
        sink="delta",
        partitions=1,
        bad_rate=0.1,
        batch_size=25,
        max_pending=3,
    ),
]


def covering(test: Any) -> Any:
    for i, case in enumerate(reversed(COVERING)):
        test = example(count=30 + 7 * i, input_seed=1000 + i, seed=17 * i, **case)(test)
    return test


@settings(
    max_examples=1,
    deadline=None,
    derandomize=True,
    database=None,
    # Shrinking only ever runs after a failure: then the rerun cost buys a small case.
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@covering
@given(
    count=st.integers(20, 50),
    input_seed=st.integers(0, 2**31),
    bad_rate=st.sampled_from([0.0, 0.1]),
    partitions=st.integers(1, 3),
    spout=st.sampled_from(["opaque", "partitioned", "transactional"]),
    sink=st.sampled_from(["redis", "delta"]),
    batch_size=st.integers(8, 30),  # a few txids per run: each costs Spark jobs
    max_pending=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_the_demo_counts_random_tweets_exactly_under_random_faults(
    spark: Any,
    redis_url: str,
    count: int,
    input_seed: int,
    bad_rate: float,
    partitions: int,
    spout: str,
    sink: str,
    batch_size: int,
    max_pending: int,
    seed: int,
) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()  # the fixture flushes once per test, and this test has several examples
    client.close()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / "tweets"
        generate(path, count, input_seed, partitions, bad_rate)
        target = (
            ["--redis-url", redis_url] if sink == "redis" else ["--delta-path", str(root / "delta")]
        )
        out = io.StringIO()
        code = demo(
            [
                "run",
                "--input",
                str(path),
                "--spout",
                spout,
                "--sink",
                sink,
                *target,
                "--state-dir",
                str(root / "state"),
                "--batch-size",
                str(batch_size),
                "--max-pending",
                str(max_pending),
                "--fail-rate",
                str(FAIL_RATE),
                "--fail-seed",
                str(failing_seed(seed)),
                "--until-drained",
                "--master",
                "local[2]",
                "--top",
                "0",
            ],
            out=out,
        )
        assert code == 0, out.getvalue()
        # Faults were injected (failing_seed plans one for txid 1) and survived.
        assert run_summary(out.getvalue())["failures"] >= 1, out.getvalue()
        got = read_redis(redis_url) if sink == "redis" else read_delta(root / "delta")
        assert_exact(got, expected_counts(path), ids=False)
