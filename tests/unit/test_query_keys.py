"""What ``transactional query --help`` says of keys is one rule, and how they are read:
the columns' values joined by ``:``, in a value each ``\\`` written ``\\\\`` and, for a
key of several columns, each ``:`` written ``\\:``; ``\\N`` a null. A key that breaks
the rule says the same rule back; a key prints as itself, non-ASCII characters too."""

from __future__ import annotations

import json

import pytest

from committers import CounterTable
from committers.states import StateReader
from transactional.cli._parser import build_parser
from transactional.cli._query import query_json, query_lines


def reader(*keys: str) -> StateReader:
    return StateReader(CounterTable("t", keys), lookup=None)


def key_help() -> str:
    query = build_parser().commands["query"]
    return next(a.help for a in query._actions if a.dest == "keys") or ""


def test_the_help_says_one_rule_and_parse_keys_follows_it() -> None:
    # Before: "a single-column key as it is (a '\' in it written '\\')": "as it is" and
    # the doubled '\' said two things.
    assert key_help() == (
        "a key: its columns' values joined by ':', in a value each '\\' written '\\\\' and, "
        "for a key of several columns, each ':' written '\\:'; '\\N' for a null value"
    )
    single, pair = reader("tag"), reader("user", "tag")
    # One column: '\' doubled, ':' as typed.
    assert single.parse_keys(["#a:b", "c\\\\d", "\\N"]) == [("#a:b",), ("c\\d",), (None,)]
    # Several: ':' inside a value escaped, '\' doubled.
    assert pair.parse_keys(["u\\:1:#x", "a\\\\:\\N"]) == [("u:1", "#x"), ("a\\", None)]


@pytest.mark.parametrize(
    ("keys", "text", "how"),
    [
        (("tag",), "a\\b", "write its value with each '\\' as '\\\\' ('\\N': a null)"),
        (
            ("user", "tag"),
            "only-one",
            "give 2 values joined by ':', in each '\\' written '\\\\' and ':' written '\\:' "
            "('\\N': a null)",
        ),
    ],
)
def test_a_key_that_breaks_the_rule_says_how_to_write_it(
    keys: tuple[str, ...], text: str, how: str
) -> None:
    with pytest.raises(ValueError) as bad:
        reader(*keys).parse_keys([text])
    assert str(bad.value).startswith(f"key {text!r}: ")
    assert str(bad.value).endswith(f"state 't' is keyed by {list(keys)}: {how}")


def test_a_non_ascii_key_prints_as_itself_in_lines_and_json() -> None:
    table = CounterTable("hashtags", ("user", "tag"))
    keys = reader("user", "tag").parse_keys(["zoë:#été"])
    assert keys == [("zoë", "#été")]
    assert query_lines(table, keys, [3]) == ['user="zoë", tag="#été"\t3']
    printed = query_json(table, keys, [3])
    assert '"key": ["zoë", "#été"]' in printed
    assert json.loads(printed)["values"] == [{"key": ["zoë", "#été"], "value": 3}]
