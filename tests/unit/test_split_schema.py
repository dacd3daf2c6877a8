"""The field names ``split_frame`` gives a batch's splits, read from a DDL schema."""

from __future__ import annotations

import pytest

from transactional.sources.base import _field_names


@pytest.mark.parametrize(
    ("schema", "names"),
    [
        ("path STRING, lo LONG, hi LONG", ["path", "lo", "hi"]),
        ("  a INT ,b   BINARY", ["a", "b"]),
        (
            "`odd name` STRING, d DECIMAL(10, 2), s STRUCT<x: INT, y: ARRAY<INT>>, m MAP<STRING, INT>",
            ["odd name", "d", "s", "m"],
        ),
        ("one STRING", ["one"]),
        ("`a``b` INT, `c,d` STRING", ["a`b", "c,d"]),
    ],
)
def test_the_names_of_a_schemas_fields(schema: str, names: list[str]) -> None:
    assert _field_names(schema) == names
