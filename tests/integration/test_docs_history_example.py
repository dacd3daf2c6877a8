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
    spark: Any,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
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

    # A write under the first run's fence token (1) after the second run's (2): what a
    # leader deposed by then would leave. The page's reading of the log names it.
    from deltalake.transaction import CommitProperties, Transaction

    pages_table = DeltaTable(str(delta / "pages"))
    late = CommitProperties(
        app_transactions=[Transaction("late", 1)],
        custom_metadata={"userMetadata": '{"fence": 1}'},
    )
    rows = pages_table.to_pyarrow_table().slice(0, 1)
    write_deltalake(str(delta / "pages"), rows, mode="append", commit_properties=late)
    version = DeltaTable(str(delta / "pages")).version()
    capsys.readouterr()
    names = run_example(
        "docs/how-to/check-history.md", "deposed(log)", {"TABLE": str(delta / "pages")}, monkeypatch
    )
    # Each run's commits of rows carry its own token: the crashed run's 1, the rerun's 2.
    wrote = [c.fence for c in names["log"] if c.changes]
    assert wrote[0] == 1 and 2 in wrote and wrote[-1] == 1
    assert wrote[:-1] == sorted(wrote[:-1])
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and printed[0].startswith(f"version {version} written under fence 1")
    assert printed[0].endswith("under fence 2")
    verdict = judge(read_delta(delta, tables), answer, tables)
    assert any("a deposed leader's write" in p for p in verdict.phantoms), verdict.phantoms
