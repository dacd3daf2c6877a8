"""Aggregate states (real Redis, real Delta on both commit paths): ``Count``, ``Sum``,
``Min``, ``Max`` and ``Last`` kept per key by one committer, in transactional and
opaque mode, over single commits, a replayed txid whose opaque replay changed its rows,
and a commit group replayed with other rows; every table compared with a fold of the
applied batches computed here (Python ints, ``Fraction``, ``Decimal``), read back
whole and by key (``state(name).get``). Batches whose value is not defined (two last
values at one order, a NaN) are refused with nothing written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import redis

from committers import Count, CounterTable, DeltaCommitter, Last, Max, Min, RedisCommitter, Sum
from committers.delta._committer import MAX_DRIVER_ROWS
from transactional.committer import CommitterContext
from transactional.errors import ConfigurationError, ContractError
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

pytestmark = [pytest.mark.integration, pytest.mark.connect]

#: (key, value as a multiple of 1/8 or None, order)
Row = tuple[str | None, float | None, int]

#: Commits in order: (txids, attempt, rows per txid). A replay of txid 2 changes its rows
#: (opaque: redone; transactional: skipped), and the group 3..4 is committed twice.
COMMITS: list[tuple[tuple[int, ...], int, list[list[Row]]]] = [
    (
        (1,),
        1,
        [[("a", 2.5, 1), ("a", -1.25, 2), ("b", 7.0, 1), (None, 0.5, 3), ("c", None, 1)]],
    ),
    ((2,), 1, [[("a", -9.0, 5), ("b", 100.0, 4), ("new", 3.0, 1), ("b", None, 9)]]),
    ((2,), 2, [[("a", 4.125, 5), ("a", 4.125, 5), ("c", 1.5, 2), (None, None, 1)]]),
    ((3, 4), 1, [[("a", 0.25, 1)], [("b", -3.5, 2), ("a", 16.0, 0), ("d", 2.0, 1)]]),
    ((3, 4), 2, [[("a", 0.375, 1), ("e", 5.0, 7)], [("b", 64.0, 2), ("b", -0.5, 1)]]),
    ((5,), 1, [[("c", -0.125, 3), ("e", 1.0, 1), ("a", 2.0, 4), ("a", 8.0, 2)]]),
]

STATES = {
    "rows": lambda vt: Count("rows", "k"),
    "valued": lambda vt: Count("valued", "k", value="amount"),
    "total": lambda vt: Sum("total", "k", "amount", vt),
    "low": lambda vt: Min("low", "k", "amount", vt),
    "high": lambda vt: Max("high", "k", "amount", vt),
    "latest": lambda vt: Last("latest", "k", "amount", order_by="seq", value_type=vt),
}

#: The value column's Spark type per declared value type (held exactly by it).
COLUMN = {"long": "bigint", "double": "double", "decimal(20,4)": "decimal(12,4)"}


def typed(value_type: str, x: float | None) -> Any:
    if x is None:
        return None
    if value_type == "long":
        return int(x * 8)
    if value_type == "double":
        return x
    return Decimal(str(x)).quantize(Decimal("0.0001")) + Decimal("0.0001")


def applied(mode: CommitMode) -> list[list[Row]]:
    """The batches the sinks must hold, txid by txid: each txid's first attempt
    (transactional: a replay is skipped) or its last (opaque: a replay is redone)."""
    chosen: dict[tuple[int, ...], list[list[Row]]] = {}
    for txids, _, rows in COMMITS:
        if txids not in chosen or mode is CommitMode.OPAQUE:
            chosen[txids] = rows
    return [batch for txids in sorted(chosen) for batch in chosen[txids]]


def fold(name: str, value_type: str, batches: list[list[Row]]) -> dict[tuple[Any, ...], Any]:
    """Per key, what the state must hold: computed in exact Python arithmetic."""
    out: dict[tuple[Any, ...], Any] = {}
    for batch in batches:
        last: dict[str | None, tuple[int, Any]] = {}
        for key, x, order in batch:
            k = (key,)
            if name == "rows":
                out[k] = out.get(k, 0) + 1
                continue
            if x is None:
                continue
            v = typed(value_type, x)
            if name == "valued":
                out[k] = out.get(k, 0) + 1
            elif name == "total":
                out[k] = out.get(k, 0) + (Fraction(v) if value_type == "double" else v)
            elif name == "low":
                out[k] = min(out.get(k, v), v)
            elif name == "high":
                out[k] = max(out.get(k, v), v)
            elif key not in last or order > last[key][0]:
                last[key] = (order, v)
        for key, (_, v) in last.items():
            out[(key,)] = v
    if value_type == "double" and name == "total":
        return {k: float(v) for k, v in out.items()}
    return out


def inputs(spark: Any, value_type: str, rows: list[Row]) -> dict[str, Any]:
    data = [(k, typed(value_type, x), seq) for k, x, seq in rows]
    frame = spark.createDataFrame(data, f"k string, amount {COLUMN[value_type]}, seq int")
    return dict.fromkeys(STATES, frame)


def attempt_of(txid: int, number: int) -> TransactionAttempt:
    return TransactionAttempt(txid, number)


def run(spark: Any, sink: Any, value_type: str) -> list[CommitOutcome]:
    outcomes = []
    for txids, number, batches in COMMITS:
        attempts = [attempt_of(t, number) for t in txids]
        prepared = [
            sink.prepare(a, inputs(spark, value_type, rows))
            for a, rows in zip(attempts, batches, strict=True)
        ]
        if len(txids) == 1:
            outcomes.append(sink.commit(attempts[0], prepared[0]))
        else:
            outcomes.append(sink.commit_group(attempts, prepared))
    return outcomes


def expected_outcomes(mode: CommitMode) -> list[CommitOutcome]:
    again = CommitOutcome.REAPPLIED if mode is CommitMode.OPAQUE else CommitOutcome.SKIPPED
    new = CommitOutcome.APPLIED
    return [new, new, again, new, again, new]


def tables(value_type: str) -> dict[str, Any]:
    return {name: make(value_type) for name, make in STATES.items()}


@dataclass
class Sink:
    committer: Any
    read_all: Callable[[str], dict[tuple[Any, ...], Any]]


def redis_sink(url: str, value_type: str, mode: CommitMode) -> Sink:
    committer = RedisCommitter(url, tables(value_type), mode=mode)
    committer.open(CommitterContext(None, "topo", "states"))
    return Sink(committer, committer.read)


#: The Delta committer's two commit paths, as its ``max_driver_rows``.
PATHS = {"delta-rs": MAX_DRIVER_ROWS, "delta-spark": 0}


def delta_sink(spark: Any, path: Path, value_type: str, mode: CommitMode, how: str) -> Sink:
    committer = DeltaCommitter(str(path), tables(value_type), mode=mode, max_driver_rows=PATHS[how])
    committer.open(CommitterContext(spark, "topo", "states"))

    def read_all(name: str) -> dict[tuple[Any, ...], Any]:
        column = committer.counters[name].column
        rows = spark.read.format("delta").load(committer.location(name)).collect()
        return {(r["k"],): r[column] for r in rows}

    return Sink(committer, read_all)


def check(sink: Sink, value_type: str, mode: CommitMode) -> None:
    batches = applied(mode)
    for name in STATES:
        want = fold(name, value_type, batches)
        assert sink.read_all(name) == want, name
        asked = [*want, ("absent",)]
        got = sink.committer.state(name).get([k[0] for k in asked])
        assert got == [want.get(k) for k in asked], name
    assert sink.committer.committed_txid() == 5


#: Every value type and mode on Redis; on Delta, a long and a double in ``make test``,
#: a decimal in ``make test-slow`` and the rest of them (delta-spark's MERGE among them:
#: ``make test`` commits through it in the undefined-value test) in ``make
#: test-exhaustive`` and a fifth of them in each rotated ``make test-slow`` (each Delta
#: case commits six tables six times; through delta-spark's MERGE, three to four minutes
#: each on 2 cores beside another suite).
FAST = {
    ("delta-rs", "long", CommitMode.TRANSACTIONAL),
    ("delta-rs", "double", CommitMode.OPAQUE),
}
SLOW = {("delta-rs", "decimal(20,4)", CommitMode.OPAQUE)}
#: On Connect, make connect-test keeps these and FAST; the rest in make connect-test-full
#: (and a fifth of them in each rotated make connect-test).
LEAN = {("redis", "decimal(20,4)", CommitMode.OPAQUE)}


def marks(case: tuple[str, str, CommitMode]) -> list[pytest.MarkDecorator]:
    """Where a case runs: FAST and LEAN everywhere, the other Redis cases in every
    classic run, SLOW in make test-slow, the other Delta cases in make test-exhaustive."""
    if case in FAST | LEAN:
        return []
    if case[0] == "redis":
        return [pytest.mark.connect_full]
    if case in SLOW:
        return [pytest.mark.slow]
    return [pytest.mark.slow, pytest.mark.exhaustive]


CASES = [
    pytest.param(where, value_type, mode, marks=marks((where, value_type, mode)))
    for where, value_type, mode in [
        *[(s, v, m) for s in ("redis", "delta-rs") for v in COLUMN for m in CommitMode],
        ("delta-spark", "long", CommitMode.TRANSACTIONAL),
        ("delta-spark", "decimal(20,4)", CommitMode.OPAQUE),
        ("delta-spark", "double", CommitMode.OPAQUE),
    ]
]


@pytest.mark.parametrize(("where", "value_type", "mode"), CASES)
@pytest.mark.rotated
def test_every_aggregate_is_exact_across_replays_and_groups(
    spark: Any, redis_url: str, tmp_path: Path, where: str, value_type: str, mode: CommitMode
) -> None:
    if where == "redis":
        sink = redis_sink(redis_url, value_type, mode)
    else:
        sink = delta_sink(spark, tmp_path, value_type, mode, where)
    assert run(spark, sink.committer, value_type) == expected_outcomes(mode)
    check(sink, value_type, mode)


def test_the_fold_itself() -> None:
    """The expected values of the scenario, by hand for key ``a`` in opaque mode."""
    batches = applied(CommitMode.OPAQUE)
    a = ("a",)
    assert fold("rows", "long", batches)[a] == 2 + 2 + 1 + 2
    assert fold("total", "long", batches)[a] == 8 * (1.25 + 8.25 + 0.375 + 10.0)
    assert fold("low", "long", batches)[a] == 8 * -1.25
    assert fold("high", "long", batches)[a] == 8 * 8.0
    # txid 5 has a at orders 4 (2.0) and 2 (8.0): the greater order wins.
    assert fold("latest", "long", batches)[a] == 8 * 2.0
    # Transactional: txid 2's first attempt (a -9.0), group 3..4's first (a 0.25, 16.0).
    assert fold("low", "long", applied(CommitMode.TRANSACTIONAL))[a] == 8 * -9.0


@pytest.mark.parametrize(
    "where", ["redis", "delta-rs", pytest.param("delta-spark", marks=pytest.mark.connect_full)]
)
@pytest.mark.rotated
def test_an_undefined_last_value_or_a_nan_is_refused_with_nothing_written(
    spark: Any, redis_url: str, tmp_path: Path, where: str
) -> None:
    mode = CommitMode.TRANSACTIONAL
    if where == "redis":
        sink = redis_sink(redis_url, "double", mode)
    else:
        sink = delta_sink(spark, tmp_path, "double", mode, where)
    committer = sink.committer
    tie = [("a", 1.0, 3), ("a", 2.0, 3), ("b", 1.0, 1)]
    with pytest.raises(
        ContractError, match=r"'latest'.*'a'.*different values at its greatest 'seq'"
    ):
        committer.prepare(attempt_of(1, 1), inputs(spark, "double", tie))
    nan = [("a", float("nan"), 1), ("a", 1.0, 2)]
    with pytest.raises(ContractError, match=r"(?i)'a'.*nan"):
        committer.prepare(attempt_of(1, 1), inputs(spark, "double", nan))
    assert committer.committed_txid() is None
    for name in STATES:
        assert sink.read_all(name) == {}
    # Equal values at the greatest order are one last value.
    same = [("a", 1.0, 3), ("a", 1.0, 3), ("a", 7.0, 1)]
    at = attempt_of(1, 1)
    prepared = committer.prepare(at, inputs(spark, "double", same))
    assert committer.commit(at, prepared) is CommitOutcome.APPLIED
    assert committer.state("latest").get(["a"]) == [1.0]


def test_declarations_a_state_cannot_keep_are_refused_at_once() -> None:
    with pytest.raises(ConfigurationError, match=r"'latest'.*needs order_by"):
        Last("latest", "k", "amount", order_by=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"'rows'.*a count is a 'long'"):
        CounterTable("rows", ("k",), None, "double", {}, "count")
    with pytest.raises(ConfigurationError, match=r"'m'.*clash with the sink's own columns"):
        Max("m", ("max",), "amount")
    with pytest.raises(ConfigurationError, match=r"distinct"):
        Last("l", "k", "amount", order_by="amount")


def test_redis_refuses_a_hash_kept_by_another_aggregate(redis_url: str) -> None:
    url = redis_url
    client = redis.Redis.from_url(url, decode_responses=True)
    client.hset("transactional:topo:states:value_types", "high", "long")
    client.close()
    with pytest.raises(ConfigurationError, match=r"'high' holds sums of long.*the max of long"):
        redis_sink(url, "long", CommitMode.TRANSACTIONAL)


def test_delta_refuses_a_table_kept_by_another_aggregate(spark: Any, tmp_path: Path) -> None:
    delta_sink(spark, tmp_path, "long", CommitMode.TRANSACTIONAL, "delta-rs")
    other = DeltaCommitter(str(tmp_path), {"x": Min("high", "k", "amount")})
    with pytest.raises(
        ConfigurationError, match=r"high keeps the max \(column 'max'\).*'high' as aggregate 'min'"
    ):
        other.open(CommitterContext(spark, "topo", "states"))


@pytest.mark.classic
def test_the_docs_states_example_keeps_each_aggregate(
    spark: Any, tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(``spark``: the suite's session, with Delta, exists before the example's.)"""
    import json
    import random

    from tests.docs import run_example

    rng = random.Random(5)
    orders = tmp_path / "orders"
    orders.mkdir()
    good: list[tuple[str, Decimal, int]] = []
    for part in range(2):
        lines = []
        for _ in range(12):
            shop, at = f"s{rng.randint(1, 3)}", rng.randint(0, 10**6)
            amount = Decimal(rng.randint(-500, 99999)) / 100
            good.append((shop, amount, at))
            lines.append(json.dumps({"shop": shop, "amount": float(amount), "at": at}))
        lines.insert(4, '{"shop": "s1", "amount": "lots", "at": 3}')
        (orders / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")
    run_example(
        "docs/how-to/committers.md",
        "from committers import Count, Last, Max, Min, RedisCommitter, Sum",
        {"REDIS_URL": redis_url, "ORDERS": str(orders), "STATE": str(tmp_path / "s.db")},
        monkeypatch,
    )
    shops = sorted({s for s, _, _ in good})
    mine = {s: [(a, at) for t, a, at in good if t == s] for s in shops}
    assert len({at for s in shops for _, at in mine[s]}) == len(good)  # no tie on "at"
    want = {
        "orders": {s: str(len(v)) for s, v in mine.items()},
        "revenue": {s: str(sum(a for a, _ in v)) for s, v in mine.items()},
        "smallest": {s: str(min(a for a, _ in v)) for s, v in mine.items()},
        "largest": {s: str(max(a for a, _ in v)) for s, v in mine.items()},
        "latest": {s: str(max(v, key=lambda p: p[1])[0]) for s, v in mine.items()},
    }
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    got = {name: client.hgetall(name) for name in want}
    dead = [json.loads(v) for v in client.lrange("dead_letters", 0, -1)]
    client.close()
    assert {n: {k: Decimal(v) for k, v in h.items()} for n, h in got.items()} == {
        n: {k: Decimal(v) for k, v in h.items()} for n, h in want.items()
    }
    assert [d["raw"] for d in dead] == ['{"shop": "s1", "amount": "lots", "at": 3}'] * 2


def test_keys_given_as_text_are_read_as_the_key_columns_types(spark: Any, tmp_path: Path) -> None:
    """``transactional query``'s keys: ``day:n`` texts, read as a DATE and a BIGINT by
    the Delta lookup, a null as ``\\N``; a key with the wrong number of columns is
    refused saying how to write one."""
    import datetime

    table = Max("peaks", ("day", "n"), "amount", key_types={"day": "date", "n": "bigint"})
    committer = DeltaCommitter(str(tmp_path), {"in": table})
    committer.open(CommitterContext(spark, "topo", "peaks"))
    rows = [
        (datetime.date(2024, 5, 1), 7, 3),
        (datetime.date(2024, 5, 1), 7, 11),
        (datetime.date(2024, 5, 2), None, -4),
    ]
    frame = spark.createDataFrame(rows, "day date, n bigint, amount bigint")
    at = attempt_of(1, 1)
    committer.commit(at, committer.prepare(at, {"in": frame}))
    state = committer.state("peaks")
    keys = state.parse_keys(["2024-05-01:7", "2024-05-02:\\N", "2024-05-01:8"])
    assert keys == [("2024-05-01", "7"), ("2024-05-02", None), ("2024-05-01", "8")]
    assert state.get(keys) == [11, -4, None]
    assert state.get([(datetime.date(2024, 5, 1), 7)]) == [11]
    with pytest.raises(ValueError, match=r"keyed by \['day', 'n'\]: give 2 values joined by ':'"):
        state.parse_keys(["2024-05-01"])
    with pytest.raises(ValueError, match=r"key column 'day'.*date32.*cannot be read"):
        state.get([("May 1st", "7")])
