"""The history checker's example (docs/how-to/check-history.md) runs as printed on real
Redis and Delta: its crash fires, both sinks come out exact by the checker, and by a
reading of this test's own with redis-py and ``deltalake``; then each sink is broken by
hand and the checker names what was broken."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from deltalake import DeltaTable

from tests.docs import run_example
from transactional.faults import FaultPoint
from transactional.testing.history import judge, read_delta, read_redis

pytestmark = [pytest.mark.integration, pytest.mark.classic]


def test_the_history_example_checks_both_sinks_and_names_what_breaks_them(
    spark: Any, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    delta = tmp_path / "delta"
    names = run_example(
        "docs/how-to/check-history.md",
        "judge(image, answer, TABLES)",
        {"REDIS_URL": redis_url, "DELTA_PATH": str(delta)},
        monkeypatch,
    )
    first, second = names["harness"].runs
    assert first.crashed and first.injected == [(FaultPoint.AFTER_SINK_WRITE, 3, 1)]
    assert not second.crashed

    # The answer again, from the page's input, and each sink read apart from the checker.
    pages = Counter(page for _, page in names["VIEWS"] if page is not None)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert {k: int(v) for k, v in client.hgetall("views:pages").items()} == pages
    assert client.hlen("views:views") == 400 and client.llen("views:dead_letters") == 100
    rows = DeltaTable(str(delta / "pages")).to_pyarrow_table().to_pylist()
    assert {r["page"]: r["count"] for r in rows} == pages

    answer, tables = names["answer"], names["TABLES"]
    # Redis: a view counted twice, a view lost, a page miscounted, a stray key.
    client.hincrby("views:views", "1", 1)
    client.hdel("views:views", "2")
    client.hincrby("views:pages", "home", 5)
    client.set("views:stray", 1)
    client.close()
    verdict = judge(read_redis(redis_url, tables, key_prefix="views:"), answer, tables)
    assert verdict.duplicated == ("views '1': 2 times, not 1",)
    assert verdict.lost == ("views '2': 0 of 1 times",)
    assert verdict.miscounted == (f"pages 'home': {pages['home'] + 5}, not {pages['home']}",)
    assert verdict.phantoms == ("key 'views:stray'",)

    # Delta: one dead letter removed, through deltalake, by a commit that carries no
    # txid marker (which the table's own log shows).
    from deltalake import write_deltalake

    letters = DeltaTable(str(delta / "dead_letters")).to_pyarrow_table()
    write_deltalake(str(delta / "dead_letters"), letters.slice(1), mode="overwrite")
    removed = letters.column("raw")[0].as_py()
    version = DeltaTable(str(delta / "dead_letters")).version()
    verdict = judge(read_delta(delta, tables), answer, tables)
    assert verdict.lost == (f"dead letter {removed!r}: 0 of 1 times",)
    assert verdict.phantoms == (
        f"dead_letters version {version}: rows changed in a commit with no txid marker",
    )
    assert not (verdict.duplicated or verdict.miscounted)
