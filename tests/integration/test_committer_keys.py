"""Keys never merge (real Redis, real Delta): ``:``, the escape character, ``\\N`` and
empty strings in every column of a multi-column key, and nulls, each keep their own row,
checked against counts computed here; key types a sink cannot encode are refused before
anything is written."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import redis

from committers import CounterTable, DeltaCommitter, RedisCommitter, decode_key
from committers.delta._committer import MAX_DRIVER_ROWS
from transactional.committer import CommitterContext
from transactional.errors import ConfigurationError, ContractError
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

# On Connect in make connect-test-full (the MERGE's SQL is the same text on both sessions).
pytestmark = [pytest.mark.integration, pytest.mark.connect, pytest.mark.connect_full]

#: The separator, the escape, the null marker and their mixes, "" and null.
TRICKY: list[str | None] = ["", None, ":", "\\", "\\N", "N", "a:b", "\\:", "::", ":\\N"]
COLUMNS = ("a", "b", "c")
SCHEMA = "a string, b string, c string, n bigint"


def tricky_rows() -> tuple[list[tuple[Any, ...]], Counter[tuple[str | None, ...]]]:
    """One row per combination (count = its index), every fifth repeated."""
    rows, want = [], Counter[tuple[str | None, ...]]()
    for i, key in enumerate(itertools.product(TRICKY, repeat=3)):
        copies = 2 if i % 5 == 0 else 1
        for _ in range(copies):
            rows.append((*key, i + 1))
            want[key] += i + 1
    return rows, want


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


def commit(sink: Any, txid: int, attempt: int, inputs: dict[str, Any]) -> CommitOutcome:
    at = TransactionAttempt(txid, attempt)
    return sink.commit(at, sink.prepare(at, inputs))


def opened_redis(url: str, tables: dict[str, CounterTable], mode: CommitMode) -> RedisCommitter:
    sink = RedisCommitter(url, tables, mode=mode)
    sink.open(CommitterContext(None, "topo", "keys"))
    return sink


@pytest.mark.parametrize("mode", list(CommitMode))
def test_redis_multi_column_keys_with_any_characters_never_merge(
    spark: Any, redis_url: str, client: redis.Redis, mode: CommitMode
) -> None:
    rows, want = tricky_rows()
    table = CounterTable("triples", COLUMNS, "n")
    pairs = CounterTable("pairs", ("user", "tag"), "n")
    sink = opened_redis(redis_url, {"t": table, "p": pairs}, mode)
    issue = [("@a:#b", "#c", 1), ("@a", "#b:#c", 1)]  # joined with ':' both were "@a:#b:#c"
    given = {
        "t": spark.createDataFrame(rows, SCHEMA),
        "p": spark.createDataFrame(issue, "user string, tag string, n bigint"),
    }
    assert commit(sink, 1, 1, given) is CommitOutcome.APPLIED
    raw = client.hgetall("triples")
    assert len(raw) == len(want) == len(TRICKY) ** 3  # one field per distinct key
    assert Counter({decode_key(f, COLUMNS): int(v) for f, v in raw.items()}) == want
    assert sink.read("triples") == dict(want)
    assert sink.read("pairs") == {("@a:#b", "#c"): 1, ("@a", "#b:#c"): 1}
    assert len(client.hgetall("pairs")) == 2
    if mode is CommitMode.OPAQUE:
        # An undo restores field by field: a replay without half the keys leaves those
        # keys out exactly, whatever their characters.
        kept = [r for r in rows if r[0] in ("", None, "a:b")]
        given["t"] = spark.createDataFrame(kept, SCHEMA)
        assert commit(sink, 1, 2, given) is CommitOutcome.REAPPLIED
        again: Counter[tuple[str | None, ...]] = Counter()
        for *key, n in kept:
            again[tuple(key)] += n
        assert sink.read("triples") == dict(again)
        assert len(client.hgetall("triples")) == len(again)
    sink.close()


def test_redis_single_column_keys_stay_plain_and_null_is_not_empty(
    spark: Any, redis_url: str, client: redis.Redis
) -> None:
    sink = opened_redis(redis_url, {"t": CounterTable("tags", ("tag",), "n")}, CommitMode.OPAQUE)
    values = ["#x", "a:b", "", None, None, "\\N", "#tag:"]
    given = {"t": spark.createDataFrame([(v, 1) for v in values], "tag string, n bigint")}
    assert commit(sink, 1, 1, given) is CommitOutcome.APPLIED
    # Plain values as readers of the demo's hashtags expect; a null apart from "".
    assert client.hgetall("tags") == {
        "#x": "1",
        "a:b": "1",
        "": "1",
        "\\N": "2",
        "\\\\N": "1",
        "#tag:": "1",
    }
    assert sink.read("tags") == {(v,): n for v, n in Counter(values).items()}
    sink.close()


def test_redis_typed_keys_are_spark_strings_and_others_are_refused(
    spark: Any, redis_url: str, client: redis.Redis
) -> None:
    table = CounterTable("typed", ("n", "flag", "day"), "v")
    sink = opened_redis(redis_url, {"t": table}, CommitMode.TRANSACTIONAL)
    rows = [(-(2**63), True, date(2024, 1, 31), 1), (7, False, None, 2), (7, False, None, 3)]
    given = {"t": spark.createDataFrame(rows, "n bigint, flag boolean, day date, v bigint")}
    assert commit(sink, 1, 1, given) is CommitOutcome.APPLIED
    assert client.hgetall("typed") == {f"{-(2**63)}:true:2024-01-31": "1", "7:false:\\N": "5"}
    for column in ("double", "timestamp", "binary", "map<string,int>", "decimal(10,2)"):
        frame = spark.range(1).selectExpr(
            f"CAST(NULL AS {column}) AS n", "true AS flag", "DATE'2024-01-01' AS day", "1L AS v"
        )
        with pytest.raises(
            ContractError, match=rf"'keys'.*RedisCommitter.*key column 'n' is {re.escape(column)}"
        ):
            commit(sink, 2, 1, {"t": frame})
    assert client.hgetall("typed") == {f"{-(2**63)}:true:2024-01-31": "1", "7:false:\\N": "5"}
    assert sink.committed_txid() == 1
    sink.close()


@pytest.mark.parametrize("driver_rows", [MAX_DRIVER_ROWS, 0], ids=["delta-rs", "delta-spark"])
def test_delta_keeps_tricky_key_columns_apart(spark: Any, tmp_path: Path, driver_rows: int) -> None:
    rows, want = tricky_rows()
    triples = {"t": CounterTable("triples", COLUMNS, "n")}
    sink = DeltaCommitter(str(tmp_path), triples, max_driver_rows=driver_rows)
    sink.open(CommitterContext(spark, "topo", "keys"))
    assert commit(sink, 1, 1, {"t": spark.createDataFrame(rows, SCHEMA)}) is CommitOutcome.APPLIED
    got = spark.read.format("delta").load(sink.location("triples")).collect()
    assert len(got) == len(want)
    assert Counter({(r.a, r.b, r.c): r["count"] for r in got}) == want


def test_delta_key_types_are_declared_checked_and_never_cast_lossily(
    spark: Any, tmp_path: Path
) -> None:
    table = CounterTable("typed", ("n", "day"), "v", key_types={"n": "long", "day": "date"})
    sink = DeltaCommitter(str(tmp_path), {"t": table})
    sink.open(CommitterContext(spark, "topo", "keys"))
    schema = spark.read.format("delta").load(sink.location("typed")).schema
    assert [schema[c].dataType.simpleString() for c in ("n", "day")] == ["bigint", "date"]
    # An INT key widens exactly to the table's BIGINT.
    ints = spark.createDataFrame([(1, date(2024, 2, 29), 5)], "n int, day date, v bigint")
    assert commit(sink, 1, 1, {"t": ints}) is CommitOutcome.APPLIED
    # "01" and "1" would both become 1: a string key into a BIGINT table is refused.
    strings = spark.createDataFrame([("01", date(2024, 2, 29), 1)], "n string, day date, v bigint")
    with pytest.raises(ContractError, match=r"key column 'n' is string.*keys it as bigint"):
        commit(sink, 2, 1, {"t": strings})
    mapped = spark.range(1).selectExpr("map('a', 1) AS n", "DATE'2024-01-01' AS day", "1L AS v")
    with pytest.raises(ContractError, match=r"key column 'n' is map<string,int>.*to_json"):
        commit(sink, 2, 1, {"t": mapped})
    rows = spark.read.format("delta").load(sink.location("typed")).collect()
    assert [(r.n, r.day, r["count"]) for r in rows] == [(1, date(2024, 2, 29), 5)]
    assert sink.committed_txid() == 1

    # Declared types must be the table's; a table keyed on a double is refused at open.
    other = CounterTable("typed", ("n", "day"), "v", key_types={"n": "int"})
    with pytest.raises(
        ConfigurationError, match=r"key column 'n' is bigint.*key_types\['n'\]='int'"
    ):
        DeltaCommitter(str(tmp_path), {"t": other}).open(CommitterContext(spark, "topo", "keys"))
    spark.createDataFrame([(0.5, 1)], "x double, count bigint").write.format("delta").save(
        str(tmp_path / "floats")
    )
    floats = DeltaCommitter(str(tmp_path), {"t": CounterTable("floats", ("x",))})
    with pytest.raises(ConfigurationError, match=r"key column 'x' is double.*cast to decimal"):
        floats.open(CommitterContext(spark, "topo", "keys"))


@pytest.mark.parametrize("driver_rows", [MAX_DRIVER_ROWS, 0], ids=["delta-rs", "delta-spark"])
def test_delta_key_columns_named_like_sql_words_or_in_mixed_case(
    spark: Any, tmp_path: Path, driver_rows: int
) -> None:
    """delta-rs's SQL reads ``select`` as a keyword and ``User`` as ``user`` unless quoted."""
    table = CounterTable("words", ("User", "select", "user_"), "n")
    sink = DeltaCommitter(str(tmp_path), {"t": table}, max_driver_rows=driver_rows)
    sink.open(CommitterContext(spark, "topo", "keys"))
    rows = [("A", "x", "a", 1), ("a", "x", "A", 2), ("A", "x", "a", 3), (None, None, None, 4)]
    schema = "User string, select string, user_ string, n bigint"
    for txid in (1, 2):
        frame = spark.createDataFrame(rows, schema)
        assert commit(sink, txid, 1, {"t": frame}) is CommitOutcome.APPLIED
    got = spark.read.format("delta").load(sink.location("words")).collect()
    want = Counter[tuple[Any, ...]]()
    for *key, n in rows:
        want[tuple(key)] += 2 * n
    assert Counter({(r["User"], r["select"], r["user_"]): r["count"] for r in got}) == want
    assert len(got) == len(want)
