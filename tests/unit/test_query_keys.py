"""What ``transactional query --help`` says of keys is how they are read: a
single-column key as it is (a ``:`` in it needs no escaping, a ``\\`` is written
``\\\\``), the columns of a multi-column key joined by ``:`` with ``:`` and ``\\``
escaped inside one, ``\\N`` a null; a key that breaks the rule says how to write it."""

from __future__ import annotations

import pytest

from committers import CounterTable
from committers.states import StateReader
from transactional.cli._parser import build_parser


def reader(*keys: str) -> StateReader:
    return StateReader(CounterTable("t", keys), lookup=None)


def key_help() -> str:
    parser = build_parser()
    query = parser._subparsers._group_actions[0].choices["query"]  # type: ignore[union-attr]
    return next(a.help for a in query._actions if a.dest == "keys") or ""


def test_the_help_says_what_parse_keys_does() -> None:
    text = key_help()
    assert "a single-column key as it is" in text
    assert "a multi-column key joined by ':'" in text
    single, pair = reader("tag"), reader("user", "tag")
    assert single.parse_keys(["#a:b", "c\\\\d", "\\N"]) == [("#a:b",), ("c\\d",), (None,)]
    assert pair.parse_keys(["u\\:1:#x", "a\\\\:\\N"]) == [("u:1", "#x"), ("a\\", None)]


@pytest.mark.parametrize(
    ("keys", "text", "how"),
    [
        (("tag",), "a\\b", "give the value as it is ('\\' written '\\\\', '\\N' for a null)"),
        (
            ("user", "tag"),
            "only-one",
            "give 2 values joined by ':' (escape ':' and '\\' with '\\')",
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
