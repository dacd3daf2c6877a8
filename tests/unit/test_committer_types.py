"""Value and key types of the ready-made committers, without services: what each
declared value type accepts, the exact batch sums, the Redis key encoding (reversible,
injective for any characters, null apart from ""), and the refusals at construction."""

from __future__ import annotations

import math
from datetime import date
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from committers import CounterTable, DeltaCommitter, RedisCommitter, decode_key, encode_key
from committers.keys import exact_key_cast, key_text
from committers.redis._batch import RedisBatch
from committers.redis._committer import GROUP_FIELDS
from committers.values import ValueType, exact_sum, value_text
from transactional.errors import ConfigurationError

INTEGERS = {"tinyint": 2**7, "smallint": 2**15, "int": 2**31, "bigint": 2**63}


def test_value_types_parse_to_one_spelling_and_bad_ones_name_the_table() -> None:
    assert CounterTable("t", ("k",)).value_type == "long"
    assert CounterTable("t", ("k",), value_type="BIGINT").value_type == "long"
    assert CounterTable("t", ("k",), value_type=" Double ").value_type == "double"
    assert CounterTable("t", ("k",), value_type="decimal( 38 , 10 )").value_type == (
        "decimal(38,10)"
    )
    for bad in ("float", "int", "decimal(39,2)", "decimal(5,6)", "decimal(0,0)", "decimal", ""):
        with pytest.raises(ConfigurationError, match=r"counter table 'amounts'.*value_type"):
            CounterTable("amounts", ("k",), value_type=bad)


def test_accepted_columns_are_exactly_those_the_type_holds_without_change() -> None:
    # Independent rule: a column fits if its whole range is exactly representable.
    long, double = ValueType.parse("long"), ValueType.parse("double")
    for sql, bound in INTEGERS.items():
        assert long.accepts_sql(sql)
        # A double holds every integer up to 2**53 exactly, and 2**53 + 1 not.
        assert double.accepts_sql(sql) == (bound <= 2**53)
        for p, s in ((12, 2), (20, 2), (21, 2), (38, 0), (10, 0)):
            digits = p - s
            assert ValueType.parse(f"decimal({p},{s})").accepts_sql(sql) == (
                bound - 1 < 10**digits
            ), (sql, p, s)
    assert double.accepts_sql("float") and double.accepts_sql("double")
    for refused in ("double", "float", "decimal(10,2)", "decimal(19,0)", "string", "boolean"):
        assert not long.accepts_sql(refused), refused
    assert long.accepts_sql("decimal(18,0)")  # < 10**18 < 2**63
    assert not double.accepts_sql("decimal(10,2)") and not double.accepts_sql("bigint")
    dec = ValueType.parse("decimal(12,4)")
    assert dec.accepts_sql("decimal(10,4)") and dec.accepts_sql("decimal(9,3)")
    assert not dec.accepts_sql("decimal(10,5)")  # a fifth decimal would be rounded
    assert not dec.accepts_sql("decimal(10,1)")  # 9 integer digits > 8
    assert not dec.accepts_sql("double") and not dec.accepts_sql("float")


def test_batch_sums_are_exact_in_each_type() -> None:
    values = [0.1, 0.2, 0.3, 1e16, -1e16, 2.0**-30]
    # The correctly rounded sum, computed with rationals.
    exact = float(sum((Fraction(v) for v in values), Fraction(0)))
    assert exact_sum(values, ValueType.parse("double")) == exact
    assert exact_sum([2**62, 2**62 - 1], ValueType.parse("long")) == 2**63 - 1
    with pytest.raises(ValueError, match="beyond a 64-bit LONG"):
        exact_sum([2**62, 2**62], ValueType.parse("long"))
    assert exact_sum([-(2**62), -(2**62)], ValueType.parse("long")) == -(2**63)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="NaN and infinities"):
            exact_sum([1.0, bad], ValueType.parse("double"))
    with pytest.raises(ValueError, match="beyond the largest double"):
        exact_sum([1.7e308, 1.7e308], ValueType.parse("double"))
    dec = ValueType.parse("decimal(38,10)")
    parts = [Decimal("9999999999999999999999999999.1234567890"), Decimal("0.0000000001")]
    assert exact_sum(parts, dec) == Decimal("9999999999999999999999999999.1234567891")
    with pytest.raises(ValueError, match=r"beyond decimal\(5,2\)"):
        exact_sum([Decimal("999.99"), Decimal("0.01")], ValueType.parse("decimal(5,2)"))
    assert (
        value_text(
            exact_sum([Decimal("-0.50"), Decimal("0.5")], ValueType.parse("decimal(5,2)")),
            ValueType.parse("decimal(5,2)"),
        )
        == "0.00"
    )
    assert value_text(Decimal("1E+3"), ValueType.parse("decimal(10,3)")) == "1000.000"


TRICKY = ["", ":", "\\", "\\N", "N", "a:b", ":\\:", "\\:", "::", "\\\\N", "é:ü"]


def test_the_issue_pairs_never_merge_and_single_keys_stay_plain() -> None:
    assert encode_key(["@a:#b", "#c"]) == "@a\\:#b:#c"
    assert encode_key(["@a", "#b:#c"]) == "@a:#b\\:#c"
    assert encode_key(["@x", "#a"]) == "@x:#a"  # the demo's usual pairs are unchanged
    assert encode_key(["#tag:"]) == "#tag:"  # a single column is its plain value
    assert encode_key([None]) == "\\N" and encode_key([""]) == ""
    assert encode_key(["\\N"]) == "\\\\N"
    assert encode_key(["", None]) == ":\\N"


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=4).flatmap(
        lambda n: st.tuples(
            *[st.one_of(st.none(), st.sampled_from(TRICKY), st.text(max_size=6))] * n
        )
    ),
    st.integers(min_value=1, max_value=4).flatmap(
        lambda n: st.tuples(
            *[st.one_of(st.none(), st.sampled_from(TRICKY), st.text(max_size=6))] * n
        )
    ),
)
def test_encoding_is_reversible_and_injective(a: tuple, b: tuple) -> None:  # type: ignore[type-arg]
    assert decode_key(encode_key(a), len(a)) == a
    if len(a) == len(b) and a != b:
        assert encode_key(a) != encode_key(b)


def test_every_combination_of_tricky_values_gets_its_own_field() -> None:
    keys = [(x, y) for x in [*TRICKY, None] for y in [*TRICKY, None]]
    fields = {encode_key(k) for k in keys}
    assert len(fields) == len(keys)
    assert {decode_key(f, ("a", "b")) for f in fields} == set(keys)
    for bad in ("\\", "a\\b", "\\Nx", "x\\N"):
        with pytest.raises(ValueError):
            decode_key(bad, 1)
    with pytest.raises(ValueError, match="holds 3 key column"):
        decode_key("a:b:c", 2)


def test_key_texts_are_what_spark_casts_to_string() -> None:
    assert key_text("boolean")(True) == "true" and key_text("boolean")(False) == "false"
    assert key_text("date")(date(2024, 1, 31)) == "2024-01-31"
    assert key_text("bigint")(-(2**63)) == str(-(2**63))
    assert key_text("int")(None) is None


def test_only_key_casts_that_keep_keys_apart_are_allowed() -> None:
    assert exact_key_cast("int", "bigint") and exact_key_cast("bigint", "string")
    assert exact_key_cast("date", "string") and exact_key_cast("decimal(5,2)", "decimal(10,3)")
    assert not exact_key_cast("string", "int")  # "01" and "1" would merge
    assert not exact_key_cast("bigint", "int") and not exact_key_cast("double", "string")
    assert not exact_key_cast("decimal(5,2)", "decimal(10,1)")
    assert not exact_key_cast("timestamp", "string")  # depends on the session time zone


def test_committers_refuse_key_types_they_cannot_encode_at_construction() -> None:
    for sql in ("timestamp", "double", "binary", "map<string,int>", "decimal(10,2)"):
        table = CounterTable("t", ("k",), key_types={"k": sql})
        with pytest.raises(ConfigurationError, match=r"RedisCommitter.*'t'.*'k'.*redis"):
            RedisCommitter("redis://127.0.0.1:1/0", {"in": table})
    for sql in ("double", "float", "array<int>", "struct<a:int>"):
        table = CounterTable("t", ("k",), key_types={"k": sql})
        with pytest.raises(ConfigurationError, match=r"DeltaCommitter.*'t'.*'k'.*delta"):
            DeltaCommitter("/tmp/unused", {"in": table})
    for sql in ("timestamp", "decimal(10,2)", "binary", "date", "long"):
        DeltaCommitter("/tmp/unused", {"in": CounterTable("t", ("k",), key_types={"k": sql})})
    with pytest.raises(ConfigurationError, match="not among its keys"):
        CounterTable("t", ("k",), key_types={"other": "string"})
    with pytest.raises(ConfigurationError, match="unknown key type"):
        CounterTable("t", ("k",), key_types={"k": "varchar"})


def test_input_names_are_the_counters_and_the_dead_letters() -> None:
    sink = RedisCommitter(
        "redis://127.0.0.1:1/0",
        {"a": CounterTable("x", ("k",)), "b": CounterTable("y", ("k",))},
        dead_letters="bad",
    )
    assert sink.input_names() == frozenset({"a", "b", "bad"})
    delta = DeltaCommitter("/tmp/unused", {"a": CounterTable("x", ("k",))})
    assert delta.input_names() == frozenset({"a"})
    assert delta.spark_conf()["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


def test_a_redis_batch_joins_a_commit_group_up_to_group_fields() -> None:
    """Grouping saves a commit's fixed cost only: a batch past ``GROUP_FIELDS`` fields,
    counted over all its hashes, commits alone."""
    sink = RedisCommitter(
        "redis://127.0.0.1:1/0", {"a": CounterTable("x", ("k",)), "b": CounterTable("y", ("k",))}
    )
    half = GROUP_FIELDS // 2

    def batch(extra: int) -> RedisBatch:
        x = {f"k{i}": 1 for i in range(half)}
        y = {f"k{i}": 2 for i in range(GROUP_FIELDS - half + extra)}
        return RedisBatch.of(7, {"x": x, "y": y}, ["dead letter"] * 5)

    assert sink.groupable(batch(0)) and sink.groupable(RedisBatch.of(7, {}))
    assert not sink.groupable(batch(1))
