"""The examples of "Writing to Redis and Delta" (docs/how-to/committers.md) run as
printed: the committer they declare is the one their comments describe, and the two
reading examples read back exactly what a demo run wrote (its Redis fields decoded into
their columns; its Delta tables as of its last txid), from the directory it ran in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from committers import DeltaCommitter
from tests.docs import run_example
from tests.processes import DemoProcess, generated_tweets, store_state

PAGE = "docs/how-to/committers.md"


def test_the_declaration_example_declares_what_its_comments_say() -> None:
    names = run_example(PAGE, "totals = CounterTable(")
    totals, sink = names["totals"], names["sink"]
    assert (totals.name, totals.keys, totals.value) == ("totals", ("account", "day"), "amount")
    assert totals.value_type == "decimal(18,2)" and dict(totals.key_types) == {"day": "date"}
    assert isinstance(sink, DeltaCommitter)
    assert sink.location("totals") == "/data/delta/totals"


@pytest.mark.e2e
def test_the_reading_examples_read_exactly_what_the_demo_wrote(
    spark: Any, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tweets, expected = generated_tweets(tmp_path, 400, seed=11)
    # The Delta example reads the demo's Delta sink where a run with the defaults leaves
    # it (--sink delta, the state under .transactional/ of the directory it ran in); the
    # Redis example, the hashes of a run with --sink redis.
    state = tmp_path / ".transactional"
    runs = {
        "delta": ["--state-dir", str(state), "--sink", "delta"],
        "redis": ["--state-dir", str(tmp_path / "redis-state"), "--sink", "redis"],
    }
    for sink, args in runs.items():
        more = ["--redis-url", redis_url] if sink == "redis" else []
        run = DemoProcess(
            ["run", "--input", str(tweets), *args, *more, "--until-drained"],
            tmp_path / f"{sink}.log",
        )
        assert run.wait() == 0, run.tail()
    monkeypatch.chdir(tmp_path)

    pairs = run_example(PAGE, "decode_key(f,", {"REDIS_URL": redis_url}, monkeypatch)["pairs"]
    assert pairs == dict(expected.pairs)

    snap = run_example(PAGE, "DeltaCommitter.snapshot(")["snap"]
    currtx, _ = store_state(state)
    assert snap.txid == currtx - 1  # the last txid committed
    hashtags = {r["hashtag"]: r["count"] for r in snap.table("hashtags").collect()}
    assert hashtags == dict(expected.hashtags)
