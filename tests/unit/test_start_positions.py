"""``--start-from`` text into a source's ``start=``: each form, and a clear refusal of
anything else."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from transactional.errors import ConfigurationError
from transactional.sources.base import parse_start


def test_each_form_of_a_start_position() -> None:
    assert parse_start("earliest", "S") == "earliest"
    assert parse_start(" latest ", "S") == "latest"
    assert parse_start("2026-11-24T10:00:00Z", "S") == datetime(2026, 11, 24, 10, tzinfo=UTC)
    assert parse_start("2026-11-24T10:00:00+02:00", "S") == datetime(
        2026, 11, 24, 10, tzinfo=timezone(timedelta(hours=2))
    )
    assert parse_start("12", "S", single=int) == 12
    assert parse_start("0=100,1=250", "S", key=int, value=int) == {0: 100, 1: 250}
    assert parse_start("part-1.csv=17", "S", key=str, value=int) == {"part-1.csv": 17}
    assert parse_start("events:0=1700000000000-0", "S", key=str, value=str) == {
        "events:0": "1700000000000-0"
    }


@pytest.mark.parametrize(
    ("text", "forms"),
    [
        ("newest", "earliest, latest, an ISO 8601 time, or POSITION=OFFSET pairs"),
        ("0=abc", "earliest, latest, an ISO 8601 time, or POSITION=OFFSET pairs"),
        ("v12", "earliest, latest, an ISO 8601 time, a version number"),
    ],
)
def test_anything_else_is_refused_saying_what_to_give(text: str, forms: str) -> None:
    key = None if text == "v12" else int
    single = int if text == "v12" else None
    with pytest.raises(ConfigurationError) as refused:
        parse_start(text, "KafkaPartitionedSpout", key=key, value=int, single=single)
    assert str(refused.value).startswith(
        f"KafkaPartitionedSpout: --start-from {text!r} is not a start position: give {forms}"
    )
