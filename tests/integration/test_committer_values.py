"""Values keep their type (real Redis, real Delta): double and decimal sums across
txids, a skipped replay and an opaque undo that drops a key, compared with sums computed
here (``math.fsum`` over multiples of 1/8, ``decimal``); a column the declared type
cannot hold exactly, a sum beyond it, and a non-finite double are refused with nothing
written."""

from __future__ import annotations

import decimal
import math
import re
import struct
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import redis

from committers import CounterTable, DeltaCommitter, RedisCommitter
from committers.delta._committer import MAX_DRIVER_ROWS
from committers.values import ValueType
from transactional.committer import CommitterContext
from transactional.errors import ConfigurationError, ContractError
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

# On Connect (the value types through its Arrow) in make connect-test-full; the lean run
# keeps a decimal on Redis and a long and a double on Delta (test_aggregate_states).
pytestmark = [pytest.mark.integration, pytest.mark.connect, pytest.mark.connect_full]

Rows = list[tuple[str | None, Any]]

#: Spark type of the value column, per declared value type.
COLUMN = {"long": "bigint", "double": "double", "decimal(20,4)": "decimal(12,4)"}


def typed(value_type: str, x: float) -> Any:
    """``x`` (a multiple of 1/8: exact in binary) in the value column's Python type."""
    if value_type == "double":
        return x
    if value_type == "long":
        return int(x * 8)
    return Decimal(x).quantize(Decimal("0.0001")) + Decimal("0.0001")  # a 4th decimal too


# txid -> attempt -> rows; attempt 2 of txid 2 drops "new" (created by attempt 1) and
# "b" (held before txid 2), and changes "a".
SCENARIO: dict[int, dict[int, list[tuple[str | None, float]]]] = {
    1: {1: [("a", 0.25), ("a", 0.5), ("b", 1.125), (None, 3.375), ("c", -2.0)]},
    2: {
        1: [("a", 100.125), ("b", 0.5), ("new", 7.75), (None, 0.125)],
        2: [("a", 0.375), ("a", 1024.875), ("c", 0.625)],
    },
    3: {1: [("a", -0.125), ("b", 12345.5), ("d", 0.0)]},
}


def expected(value_type: str, applied: list[list[tuple[str | None, float]]]) -> dict[Any, Any]:
    """Per key, the sum computed here: fsum (exact for these doubles), ints, Decimals."""
    per_key: dict[str | None, list[Any]] = {}
    for rows in applied:
        for key, x in rows:
            per_key.setdefault(key, []).append(typed(value_type, x))
    if value_type == "double":
        return {(k,): math.fsum(v) for k, v in per_key.items()}
    return {(k,): sum(v, Decimal(0) if value_type != "long" else 0) for k, v in per_key.items()}


def frame(spark: Any, value_type: str, rows: list[tuple[str | None, float]]) -> Any:
    data = [(k, typed(value_type, x)) for k, x in rows]
    return spark.createDataFrame(data, f"k string, amount {COLUMN[value_type]}")


def table(value_type: str) -> CounterTable:
    return CounterTable("amounts", ("k",), value="amount", value_type=value_type)


def commit(sink: Any, txid: int, attempt: int, given: Any) -> CommitOutcome:
    at = TransactionAttempt(txid, attempt)
    return sink.commit(at, sink.prepare(at, {"in": given}))


def run_scenario(spark: Any, sink: Any, value_type: str, mode: CommitMode) -> list[Any]:
    """Commits the scenario; returns the batches that count, in order."""
    outcomes = []
    for txid, attempts in SCENARIO.items():
        for attempt, rows in attempts.items():
            outcomes.append(commit(sink, txid, attempt, frame(spark, value_type, rows)))
    replay = CommitOutcome.REAPPLIED if mode is CommitMode.OPAQUE else CommitOutcome.SKIPPED
    applied = CommitOutcome.APPLIED
    assert outcomes == [applied, applied, replay, applied]
    counted = 2 if mode is CommitMode.OPAQUE else 1
    return [SCENARIO[1][1], SCENARIO[2][counted], SCENARIO[3][1]]


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


def redis_sink(url: str, value_type: str, mode: CommitMode = CommitMode.TRANSACTIONAL) -> Any:
    sink = RedisCommitter(url, {"in": table(value_type)}, mode=mode)
    sink.open(CommitterContext(None, "topo", "sums"))
    return sink


@pytest.mark.parametrize("mode", list(CommitMode))
@pytest.mark.parametrize("value_type", ["double", "decimal(20,4)", "long"])
def test_redis_sums_keep_their_type_across_replays_and_undo(
    spark: Any, redis_url: str, client: redis.Redis, value_type: str, mode: CommitMode
) -> None:
    sink = redis_sink(redis_url, value_type, mode)
    batches = run_scenario(spark, sink, value_type, mode)
    want = expected(value_type, batches)
    assert sink.read("amounts") == want
    assert all(type(v) is type(next(iter(want.values()))) for v in sink.read("amounts").values())
    if mode is CommitMode.OPAQUE:
        assert ("new",) not in want and ("new",) not in sink.read("amounts")
    # The raw text: a decimal with exactly its scale, a double that reads back exactly.
    raw = client.hgetall("amounts")
    for (key,), value in want.items():
        field = "\\N" if key is None else key
        if value_type == "decimal(20,4)":
            assert raw[field] == format(value.quantize(Decimal("0.0001")), "f")
        elif value_type == "double":
            assert float(raw[field]) == value
    assert client.hgetall("transactional:topo:sums:value_types") == {"amounts": value_type}
    snap = sink.read_all()
    assert (snap.txid, snap.tables) == (3, {"amounts": want})
    sink.close()


def test_redis_fractional_into_a_long_hash_is_refused_at_once(
    spark: Any, redis_url: str, client: redis.Redis
) -> None:
    """Before: a CommitError retried ten times; now a ContractError on the first prepare
    naming the committer, input, column, types and what to set."""
    sink = redis_sink(redis_url, "long")
    given = frame(spark, "double", [("a", 0.25), ("a", 0.5)])
    with pytest.raises(ContractError) as refused:
        commit(sink, 1, 1, given)
    message = str(refused.value)
    for part in (
        "committer 'sums'",
        "RedisCommitter",
        "input 'in'",
        "'amount'",
        "double",
        "value_type='long'",
        "value_type=...",
        "'double'",
    ):
        assert part in message, (part, message)
    assert client.keys("*") == [] and sink.committed_txid() is None
    sink.close()
    with pytest.raises(ConfigurationError, match="value_type"):
        CounterTable("amounts", ("k",), value_type="float")


@pytest.mark.parametrize(
    ("value_type", "column", "value"),
    [
        ("long", "double", 1.0),
        ("long", "decimal(10,2)", Decimal("1.00")),
        ("decimal(20,2)", "double", 0.5),
        ("decimal(20,2)", "decimal(10,3)", Decimal("0.125")),
        ("double", "bigint", 2**53 + 1),
        ("double", "decimal(10,2)", Decimal("0.10")),
        ("long", "string", "1"),
    ],
)
def test_columns_a_type_cannot_hold_exactly_are_refused_before_any_write(
    spark: Any, redis_url: str, client: redis.Redis, value_type: str, column: str, value: Any
) -> None:
    sink = redis_sink(redis_url, value_type)
    sql = ValueType.parse(value_type).sql
    first = spark.range(1).selectExpr("'a' AS k", f"CAST(1 AS {sql}) AS amount")
    assert commit(sink, 1, 1, first) is CommitOutcome.APPLIED
    before = client.hgetall("amounts")
    given = spark.createDataFrame([("a", value)], f"k string, amount {column}")
    with pytest.raises(
        ContractError, match=rf"'amount' is {re.escape(column)}.*{re.escape(value_type)}"
    ):
        commit(sink, 2, 1, given)
    assert client.hgetall("amounts") == before and sink.committed_txid() == 1
    sink.close()


def f32(x: float) -> float:
    """The float32 nearest ``x``, as a Python float (what a FLOAT column holds)."""
    return struct.unpack("f", struct.pack("f", x))[0]  # type: ignore[no-any-return]


def test_exact_widening_is_accepted(spark: Any, redis_url: str) -> None:
    cases = [
        ("long", "int", [2**31 - 1, 2**31 - 1], 2**32 - 2),
        ("double", "float", [0.1, 0.2], float(Fraction(f32(0.1)) + Fraction(f32(0.2)))),
        ("decimal(12,2)", "int", [2**31 - 1, 1], Decimal(2**31)),
        ("decimal(12,3)", "decimal(5,2)", [Decimal("999.99"), Decimal("0.01")], Decimal("1000")),
    ]
    tables = {f"in{i}": CounterTable(f"w{i}", ("k",), "amount", c[0]) for i, c in enumerate(cases)}
    sink = RedisCommitter(redis_url, tables)
    sink.open(CommitterContext(None, "topo", "widen"))
    given = {
        f"in{i}": spark.createDataFrame([("w", v) for v in values], f"k string, amount {column}")
        for i, (_, column, values, _) in enumerate(cases)
    }
    at = TransactionAttempt(1, 1)
    assert sink.commit(at, sink.prepare(at, given)) is CommitOutcome.APPLIED
    for i, (*_, want) in enumerate(cases):
        got = sink.read(f"w{i}")
        assert got == {("w",): want} and type(got[("w",)]) is type(want)
    sink.close()


def test_redis_overflow_names_the_key_and_writes_nothing(
    spark: Any, redis_url: str, client: redis.Redis
) -> None:
    top, bottom = 2**63 - 1, -(2**63)
    for mode in CommitMode:
        client.flushdb()
        sink = redis_sink(redis_url, "long", mode)
        given = spark.createDataFrame(
            [("a", top - 10), ("b", bottom + 5), ("c", 1)], "k string, amount bigint"
        )
        assert commit(sink, 1, 1, given) is CommitOutcome.APPLIED
        before = client.hgetall("amounts")
        # c would be applied first if the script wrote before checking every field.
        over = spark.createDataFrame([("c", 1), ("a", 11), ("b", -4)], "k string, amount bigint")
        with pytest.raises(
            ContractError, match=r"key \{'k': 'a'\} holds .*9223372036854775797.*adding 11"
        ):
            commit(sink, 2, 1, over)
        assert client.hgetall("amounts") == before and sink.committed_txid() == 1
        # The exact bounds are reachable (checked exactly, not in doubles).
        edge = spark.createDataFrame([("a", 10), ("b", -5)], "k string, amount bigint")
        assert commit(sink, 2, 2, edge) is CommitOutcome.APPLIED
        assert sink.read("amounts") == {("a",): top, ("b",): bottom, ("c",): 1}
        if mode is CommitMode.OPAQUE:
            # A replay is checked against the values before txid 2, not the current ones.
            again = spark.createDataFrame([("a", 10), ("b", -5)], "k string, amount bigint")
            assert commit(sink, 2, 3, again) is CommitOutcome.REAPPLIED
            assert sink.read("amounts") == {("a",): top, ("b",): bottom, ("c",): 1}
        # A batch whose own sum overflows never reaches Redis.
        huge = spark.createDataFrame([("z", 2**62), ("z", 2**62)], "k string, amount bigint")
        with pytest.raises(ContractError, match=r"key \{'k': 'z'\} sums to 9223372036854775808"):
            sink.prepare(TransactionAttempt(3, 1), {"in": huge})
        sink.close()


def test_redis_double_and_decimal_limits_are_refused_with_nothing_written(
    spark: Any, redis_url: str, client: redis.Redis
) -> None:
    sink = redis_sink(redis_url, "double")
    assert commit(sink, 1, 1, frame(spark, "double", [("a", 1.5e308)])) is CommitOutcome.APPLIED
    with pytest.raises(
        ContractError, match=r"key \{'k': 'a'\} holds '1.5e\+308'; adding 1.5e\+308"
    ):
        commit(sink, 2, 1, frame(spark, "double", [("b", 1.0), ("a", 1.5e308)]))
    for bad in (math.nan, math.inf):
        with pytest.raises(ContractError, match="NaN and infinities are not stored"):
            commit(sink, 2, 1, frame(spark, "double", [("b", 1.0), ("a", bad)]))
    assert sink.read("amounts") == {("a",): 1.5e308} and sink.committed_txid() == 1
    sink.close()

    dec = RedisCommitter(redis_url, {"in": CounterTable("money", ("k",), "amount", "decimal(5,2)")})
    dec.open(CommitterContext(None, "topo", "money"))
    given = spark.createDataFrame([("a", Decimal("999.00"))], "k string, amount decimal(5,2)")
    assert commit(dec, 1, 1, given) is CommitOutcome.APPLIED
    more = spark.createDataFrame([("a", Decimal("0.99"))], "k string, amount decimal(5,2)")
    assert commit(dec, 2, 1, more) is CommitOutcome.APPLIED
    over = spark.createDataFrame([("a", Decimal("0.01"))], "k string, amount decimal(5,2)")
    with pytest.raises(
        ContractError, match=r"holds '999.99'; adding 0.01 goes beyond decimal\(5,2\)"
    ):
        commit(dec, 3, 1, over)
    assert client.hget("money", "a") == "999.99" and dec.committed_txid() == 2
    dec.close()


def test_redis_refuses_to_open_a_hash_with_another_value_type(
    spark: Any, redis_url: str, client: redis.Redis
) -> None:
    sink = redis_sink(redis_url, "double")
    commit(sink, 1, 1, frame(spark, "double", [("a", 0.5)]))
    sink.close()
    with pytest.raises(
        ConfigurationError, match=r"'amounts' holds sums of double values.*value_type='long'"
    ):
        redis_sink(redis_url, "long")
    # A namespace from before value types were recorded held integers.
    client.delete("transactional:topo:sums:value_types")
    with pytest.raises(ConfigurationError, match=r"holds sums of long values.*value_type='double'"):
        redis_sink(redis_url, "double")


# -- Delta ---------------------------------------------------------------------------


#: The Delta committer's two commit paths, as its ``max_driver_rows``.
PATHS = {"delta-rs": MAX_DRIVER_ROWS, "delta-spark": 0}


def delta_sink(
    path: Path,
    value_type: str,
    mode: CommitMode = CommitMode.TRANSACTIONAL,
    commit_path: str = "delta-rs",
) -> Any:
    return DeltaCommitter(
        str(path), {"in": table(value_type)}, mode=mode, max_driver_rows=PATHS[commit_path]
    )


def opened(spark: Any, sink: DeltaCommitter) -> DeltaCommitter:
    sink.open(CommitterContext(spark, "topo", "sums"))
    return sink


def delta_read(spark: Any, sink: DeltaCommitter) -> dict[Any, Any]:
    rows = spark.read.format("delta").load(sink.location("amounts")).collect()
    return {(r["k"],): r["count"] for r in rows}


def test_delta_stores_a_quarter_plus_a_half_as_three_quarters(spark: Any, tmp_path: Path) -> None:
    """The issue's bug: 0.25 + 0.5 was stored as 0 (cast to LONG, silently)."""
    given = frame(spark, "double", [("a", 0.25), ("a", 0.5)])
    as_long = opened(spark, delta_sink(tmp_path / "long", "long"))
    with pytest.raises(ContractError, match=r"DeltaCommitter.*'amount' is double.*'long'"):
        commit(as_long, 1, 1, given)
    assert delta_read(spark, as_long) == {} and as_long.committed_txid() is None
    as_double = opened(spark, delta_sink(tmp_path / "double", "double"))
    assert commit(as_double, 1, 1, given) is CommitOutcome.APPLIED
    assert delta_read(spark, as_double) == {("a",): 0.75}
    schema = spark.read.format("delta").load(as_double.location("amounts")).schema
    assert schema["count"].dataType.simpleString() == "double"
    # The table keeps its type: opening it as another type is refused, naming both.
    with pytest.raises(ConfigurationError, match=r"stores 'count' as double.*'decimal\(20,4\)'"):
        opened(spark, delta_sink(tmp_path / "double", "decimal(20,4)"))


@pytest.mark.parametrize(
    ("value_type", "mode", "commit_path"),
    [
        ("double", CommitMode.OPAQUE, "delta-rs"),
        ("decimal(20,4)", CommitMode.TRANSACTIONAL, "delta-rs"),
        ("decimal(20,4)", CommitMode.OPAQUE, "delta-rs"),
        ("double", CommitMode.TRANSACTIONAL, "delta-rs"),
        ("double", CommitMode.OPAQUE, "delta-spark"),
        ("decimal(20,4)", CommitMode.TRANSACTIONAL, "delta-spark"),
    ],
)
@pytest.mark.rotated
def test_delta_sums_keep_their_type_across_replays_and_undo(
    spark: Any, tmp_path: Path, value_type: str, mode: CommitMode, commit_path: str
) -> None:
    sink = opened(spark, delta_sink(tmp_path, value_type, mode, commit_path))
    batches = run_scenario(spark, sink, value_type, mode)
    got = delta_read(spark, sink)
    assert got == expected(value_type, batches)
    schema = spark.read.format("delta").load(sink.location("amounts")).schema
    columns = ["count", "prev"] if mode is CommitMode.OPAQUE else ["count"]
    sql = "double" if value_type == "double" else value_type
    assert [schema[c].dataType.simpleString() for c in columns] == [sql] * len(columns)


@pytest.mark.parametrize("commit_path", PATHS)
def test_delta_decimal_38_keeps_every_digit_and_overflow_names_the_key(
    spark: Any, tmp_path: Path, commit_path: str
) -> None:
    money = CounterTable("amounts", ("k",), "amount", "decimal(38,10)")
    sink = DeltaCommitter(str(tmp_path), {"in": money}, max_driver_rows=PATHS[commit_path])
    sink = opened(spark, sink)
    big = Decimal("9999999999999999999999999999.1234567890")
    rows = [("a", big), ("b", Decimal("1.0000000001"))]
    schema = "k string, amount decimal(38,10)"
    assert commit(sink, 1, 1, spark.createDataFrame(rows, schema)) is CommitOutcome.APPLIED
    tiny = spark.createDataFrame([("a", Decimal("0.0000000001"))], schema)
    assert commit(sink, 2, 1, tiny) is CommitOutcome.APPLIED
    exact = decimal.Context(prec=60)  # the default context keeps only 28 digits
    want = {("a",): exact.add(big, Decimal("0.0000000001")), ("b",): Decimal("1.0000000001")}
    assert delta_read(spark, sink) == want  # Spark's default would have dropped a decimal
    over = spark.createDataFrame([("b", Decimal("1")), ("a", Decimal("0.9"))], schema)
    with pytest.raises(
        ContractError,
        match=rf"key \{{'k': 'a'\}} \(it holds {want[('a',)]}, adding 0.9",
    ):
        commit(sink, 3, 1, over)
    assert delta_read(spark, sink) == want and sink.committed_txid() == 2


@pytest.mark.parametrize("commit_path", PATHS)
@pytest.mark.rotated
def test_delta_overflow_is_refused_with_nothing_of_the_table_written(
    spark: Any, tmp_path: Path, commit_path: str
) -> None:
    first = CounterTable("first", ("k",), "amount")
    tables = {"one": first, "in": table("long")}
    sink = opened(spark, DeltaCommitter(str(tmp_path), tables, max_driver_rows=PATHS[commit_path]))
    schema = "k string, amount bigint"

    def inputs(rows: Rows) -> dict[str, Any]:
        return {
            "one": spark.createDataFrame([("x", 1)], schema),
            "in": spark.createDataFrame(rows, schema),
        }

    at = TransactionAttempt(1, 1)
    assert sink.commit(at, sink.prepare(at, inputs([("a", 2**63 - 10), ("b", 1)]))) is (
        CommitOutcome.APPLIED
    )
    before = delta_read(spark, sink)
    at = TransactionAttempt(2, 1)
    with pytest.raises(
        ContractError,
        match=rf"key \{{'k': 'a'\}} \(it holds {2**63 - 10}, adding 11\).*tables \['first'\] already hold txid 2",
    ):
        sink.commit(at, sink.prepare(at, inputs([("b", 1), ("a", 11)])))
    assert delta_read(spark, sink) == before  # never wrapped, nothing of it written
    assert sink.recorded_version("amounts") == 1 and sink.committed_txid() == 1
    # A batch whose own sum overflows, or holds a NaN, fails in prepare: nothing commits.
    with pytest.raises(ContractError, match=r"key \{'k': 'z'\} sums to beyond the type"):
        sink.prepare(at, inputs([("z", 2**62), ("z", 2**62)]))
    doubles = opened(spark, delta_sink(tmp_path / "d", "double", commit_path=commit_path))
    with pytest.raises(ContractError, match=r"key \{'k': 'n'\} sums to nan"):
        doubles.prepare(at, {"in": frame(spark, "double", [("n", math.nan), ("m", 1.0)])})
    # A stored double plus the batch's beyond the largest double: refused, not infinity.
    at = TransactionAttempt(1, 1)
    given = {"in": frame(spark, "double", [("big", 1.5e308), ("m", 1.0)])}
    assert doubles.commit(at, doubles.prepare(at, given)) is CommitOutcome.APPLIED
    at = TransactionAttempt(2, 1)
    given = {"in": frame(spark, "double", [("m", 2.0), ("big", 1.5e308)])}
    with pytest.raises(ContractError, match=r"key \{'k': 'big'\} \(it holds 1.5e\+308, adding"):
        doubles.commit(at, doubles.prepare(at, given))
    assert delta_read(spark, doubles) == {("big",): 1.5e308, ("m",): 1.0}
