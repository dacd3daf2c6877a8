"""The Redis committer's Arrow helpers against the plain Python they replace: fields
encoded as ``encode_key`` of ``key_text`` does, increments as ``value_text`` writes
them, and a group's sums added exactly (Python ints, decimals, ``math.fsum``)."""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import date
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from committers import CounterTable
from committers.keys import encode_key, key_text
from committers.redis._fields import FIELD, INC, added, encode_fields, fields_table, texts
from committers.values import ValueType
from transactional.errors import ContractError

#: Spark key type -> (Arrow type as Spark's toArrow gives it, values to draw).
KEY_TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "string": (pa.large_string(), st.text(alphabet=st.sampled_from("ab:\\N é🙂\x00"))),
    "bigint": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "int": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "tinyint": (pa.int8(), st.integers(-128, 127)),
    "boolean": (pa.bool_(), st.booleans()),
    "date": (pa.date32(), st.dates(date(1, 1, 1), date(9999, 12, 31))),
}


@st.composite
def keyed_rows(draw: st.DrawFn) -> tuple[list[str], list[tuple[Any, ...]]]:
    types = draw(st.lists(st.sampled_from(sorted(KEY_TYPES)), min_size=1, max_size=3))
    row = st.tuples(*(st.one_of(st.none(), KEY_TYPES[t][1]) for t in types))
    return types, draw(st.lists(row, max_size=20))


@settings(max_examples=300, deadline=None)
@given(keyed_rows())
def test_arrow_fields_are_encode_key_of_key_text(
    case: tuple[list[str], list[tuple[Any, ...]]],
) -> None:
    types, rows = case
    names = [f"k{i}" for i in range(len(types))]
    data = pa.table(
        {
            name: pa.array([r[i] for r in rows], KEY_TYPES[sql][0])
            for i, (name, sql) in enumerate(zip(names, types, strict=True))
        }
    )
    expected = [
        encode_key([key_text(sql)(v) for sql, v in zip(types, row, strict=True)]) for row in rows
    ]
    assert encode_fields(data, names).to_pylist() == expected


LONG, DOUBLE, DEC = (
    ValueType.parse("long"),
    ValueType.parse("double"),
    ValueType.parse("decimal(5,2)"),
)


def test_increment_texts_are_what_the_script_parses() -> None:
    longs = fields_table({"a": 2**63 - 1, "b": -(2**63), "c": 0, "d": -7})
    assert texts(longs, LONG) == (["a", "b", "c", "d"], [str(2**63 - 1), str(-(2**63)), "0", "-7"])
    wide = fields_table({"a": 2**64 + 1, "b": -(2**70)})  # a group's total past 64 bits
    assert wide.column(INC).type == pa.decimal128(38, 0)
    assert texts(wide, LONG)[1] == [str(2**64 + 1), str(-(2**70))]
    doubles = fields_table({"a": 0.1, "b": 1e-300, "c": -2.5e17})
    assert texts(doubles, DOUBLE)[1] == [repr(0.1), repr(1e-300), repr(-2.5e17)]
    decimals = fields_table({"a": Decimal("0.01"), "b": Decimal("-123.40")}, DEC)
    assert texts(decimals, DEC)[1] == ["0.01", "-123.40"]  # never 1E-2


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from("abcdefg"), st.integers(-(2**63), 2**63 - 1), max_size=7),
        min_size=2,
        max_size=5,
    )
)
def test_a_group_of_longs_is_added_exactly_even_past_64_bits(parts: list[dict[str, int]]) -> None:
    expected: dict[str, int] = defaultdict(int)
    for part in parts:
        for field, inc in part.items():
            expected[field] += inc
    table = CounterTable("h", ("k",))
    got = added(table, [fields_table(p, LONG) for p in parts], "sink", 9)
    totals = dict(zip(got.column(FIELD).to_pylist(), got.column(INC).to_pylist(), strict=True))
    assert {f: int(v) for f, v in totals.items()} == expected
    assert dict(zip(*texts(got, LONG), strict=True)) == {f: str(v) for f, v in expected.items()}


def test_a_group_of_decimals_and_of_doubles_is_added_exactly() -> None:
    table = CounterTable("h", ("k",), value_type="decimal(5,2)")
    parts = [
        fields_table({"a": Decimal("999.99"), "b": Decimal("0.01")}, DEC),
        fields_table({"a": Decimal("999.99")}, DEC),
    ]
    got = dict(zip(*texts(added(table, parts, "sink", 2), DEC), strict=True))
    assert got == {"a": "1999.98", "b": "0.01"}  # past p=5: the script checks the stored sum
    floats = CounterTable("f", ("k",), value_type="double")
    parts = [fields_table({"a": 1e16}, DOUBLE), fields_table({"a": 1.0}, DOUBLE)]
    parts.append(fields_table({"a": -1e16}, DOUBLE))
    got = dict(zip(*texts(added(floats, parts, "sink", 3), DOUBLE), strict=True))
    assert got == {"a": repr(math.fsum([1e16, 1.0, -1e16]))} and got["a"] == "1.0"


def test_a_group_of_doubles_beyond_the_largest_is_refused_with_its_key() -> None:
    floats = CounterTable("f", ("user", "tag"), value_type="double")
    parts = [
        fields_table({"@a\\:b:#x": 1.5e308}, DOUBLE),
        fields_table({"@a\\:b:#x": 1.5e308}, DOUBLE),
    ]
    with pytest.raises(ContractError, match=r"key \('@a:b', '#x'\) sum beyond the largest double"):
        added(floats, parts, "sink", 4)


def test_a_delta_group_of_doubles_beyond_the_largest_is_unstorable_not_a_crash() -> None:
    from committers.delta._arrow import Unstorable, combined_sums

    floats = CounterTable("f", ("k",), value_type="double")
    parts = [
        pa.table({"k": ["a", "b"], "inc": [1.5e308, 1.0]}),
        pa.table({"k": ["a"], "inc": [1.5e308]}),
    ]
    with pytest.raises(Unstorable) as caught:
        combined_sums(parts, floats)
    assert [(row, total) for row, _, total in caught.value.rows] == [({"k": "a"}, math.inf)]
