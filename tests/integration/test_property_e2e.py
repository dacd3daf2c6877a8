"""Random inputs, spout kinds, batch sizes, fault seeds and ``max_pending`` through the
whole demo on real services (Spark, SQLite store, Redis sink), checked against the
independent reference counts: a few examples, since each is a full run on Spark.

The tweets come from the demo's generator under a drawn seed, so even Hypothesis's
first (simplest) example holds the tokens that trip naive counters."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from examples.tweets.cli import main as demo
from examples.tweets.generate import generate
from tests.e2e.test_demo import assert_exact, redis_contents
from tests.reference import expected_counts
from transactional.faults import RandomFaults

pytestmark = pytest.mark.integration

FAIL_RATE = 0.2


def failing_seed(start: int) -> int:
    """The first seed from ``start`` whose faults fail the first attempt of txid 1, so
    every example meets at least one failure."""
    return next(s for s in range(start, start + 1000) if RandomFaults(FAIL_RATE, s).planned(1, 1))


@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],  # shrinking would rerun Spark dozens of times
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    count=st.integers(20, 50),
    input_seed=st.integers(0, 2**31),
    bad_rate=st.sampled_from([0.0, 0.1]),
    partitions=st.integers(1, 3),
    # Opaque first: Hypothesis's first example is its simplest draw, so this makes sure
    # the kind whose replays may differ runs even with only three examples.
    spout=st.sampled_from(["opaque", "partitioned", "transactional"]),
    batch_size=st.integers(8, 30),  # a few txids per run: each costs Spark jobs
    max_pending=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_the_demo_counts_random_tweets_exactly_under_random_faults(
    spark: object,
    redis_url: str,
    count: int,
    input_seed: int,
    bad_rate: float,
    partitions: int,
    spout: str,
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
        out = io.StringIO()
        code = demo(
            [
                "run",
                "--input",
                str(path),
                "--spout",
                spout,
                "--sink",
                "redis",
                "--redis-url",
                redis_url,
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
        assert "failures=0" not in out.getvalue()  # faults were injected and survived
        assert_exact(redis_contents(redis_url), expected_counts(path))
