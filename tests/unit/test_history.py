"""The history checker (``transactional.testing.history``, through the demo's tables in
``tests.history``) finds each kind of wrong it names, in images built here by hand from
a small input whose answer is written out below."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from committers import CounterTable
from tests.history import Image, MissingIds, assert_exact, judge
from tests.reference import expected_of_lines
from transactional.testing import history
from transactional.testing.history import Answer

LINES = [
    json.dumps({"id": 1, "text": "#a @u"}).encode(),
    json.dumps({"id": 2, "text": "#a #b"}).encode(),
    b"not json",
    json.dumps({"id": 3, "text": "@v"}).encode(),
]


def exact_image() -> Image:
    """What a sink that took every record once holds, counted by hand from ``LINES``
    (each key as its columns' texts, as the sinks' readers give it)."""
    return Image(
        "test",
        tables={
            "hashtags": {("#a",): 2, ("#b",): 1},
            "users": {("@u",): 1, ("@v",): 1},
            "users_hashtags": {("@u", "#a"): 1},
            "tweet_ids": {("1",): 1, ("2",): 1, ("3",): 1},
        },
        dead_letters=["not json"],
    )


def test_a_sink_that_took_every_record_once_is_exact() -> None:
    verdict = judge(exact_image(), expected_of_lines(LINES))
    assert verdict.exact, str(verdict)
    assert verdict.records == 4
    assert str(verdict) == "test: 4 records, exact"


def test_a_lost_record_and_its_counts_are_named() -> None:
    image = exact_image()
    del image.tables["tweet_ids"][("2",)]
    image.tables["hashtags"] = {("#a",): 1}  # tweet 2's #a and #b missing
    verdict = judge(image, expected_of_lines(LINES))
    assert verdict.lost == ("tweet_ids '2': 0 of 1 times",)
    assert verdict.miscounted == ("hashtags '#a': 1, not 2", "hashtags '#b': 0, not 1")
    assert not (verdict.duplicated or verdict.phantoms or verdict.leftovers)
    assert not verdict.exact


def test_a_record_counted_twice_is_a_duplicate() -> None:
    image = exact_image()
    image.tables["tweet_ids"][("3",)] += 1
    image.tables["users"][("@v",)] += 1
    image.dead_letters.append("not json")
    verdict = judge(image, expected_of_lines(LINES))
    assert verdict.duplicated == (
        "tweet_ids '3': 2 times, not 1",
        "dead letter 'not json': 2 times, not 1",
    )
    assert verdict.miscounted == ("users '@v': 2, not 1",)
    assert verdict.figures()["duplicated"] == 2 and not verdict.lost


def test_what_no_record_explains_is_a_phantom_and_a_zero_row_a_leftover() -> None:
    image = exact_image()
    image.tables["tweet_ids"][("99",)] = 1
    image.tables["hashtags"][("#z",)] = 3
    image.tables["users"][("@gone",)] = 0  # an undone attempt's key, not deleted
    image.tables["tweet_ids"][("98",)] = 0
    image.tables["extra"] = {("x",): 1}
    image.dead_letters.append("never in the input")
    image.strange.append("key 'x'")
    image.leftovers.append("staging key 's'")
    verdict = judge(image, expected_of_lines(LINES))
    assert verdict.phantoms == (
        "key 'x'",
        "table 'extra'",
        "hashtags '#z' counting 3",
        "tweet_ids '99', 1 times",
        "dead letter 'never in the input', 1 times",
    )
    assert verdict.leftovers == (
        "staging key 's'",
        "users '@gone' counting 0",
        "tweet_ids '98' counting 0",
    )
    assert not (verdict.lost or verdict.duplicated or verdict.miscounted)


def test_an_input_that_holds_a_tweet_twice_wants_it_twice() -> None:
    lines = [*LINES, LINES[0]]
    image = exact_image()
    verdict = judge(image, expected_of_lines(lines))
    assert verdict.lost == ("tweet_ids '1': 1 of 2 times",)
    image.tables["tweet_ids"][("1",)] = 2
    image.tables["hashtags"][("#a",)] = 3
    image.tables["users"][("@u",)] = 2
    image.tables["users_hashtags"][("@u", "#a")] = 2
    assert judge(image, expected_of_lines(lines)).exact


def test_a_sink_without_record_ids_fails_the_check() -> None:
    image = exact_image()
    del image.tables["tweet_ids"]
    with pytest.raises(MissingIds, match="--record-ids"):
        judge(image, expected_of_lines(LINES))


def test_a_run_without_record_ids_is_judged_by_its_tables_and_dead_letters() -> None:
    image = exact_image()
    del image.tables["tweet_ids"]
    assert_exact(image, expected_of_lines(LINES), ids=False)
    image.tables["users_hashtags"][("@u", "#a")] = 0  # an undone attempt's row, not deleted
    image.dead_letters.append("not json")
    verdict = judge(image, expected_of_lines(LINES), ids=False)
    assert verdict.miscounted == ("users_hashtags ('@u', '#a'): 0, not 1",)
    assert verdict.duplicated == ("dead letter 'not json': 2 times, not 1",)
    assert verdict.records is None and str(verdict).startswith("test: every table, ")
    with pytest.raises(AssertionError, match=r"1 duplicated .*1 miscounted"):
        assert_exact(image, expected_of_lines(LINES), ids=False)
    # Ids in a sink the test says were not counted: a table no such run writes.
    with pytest.raises(AssertionError, match=r"1 phantoms \(table 'tweet_ids'\)"):
        assert_exact(exact_image(), expected_of_lines(LINES), ids=False)


def test_the_text_of_a_verdict_shows_a_few_of_each() -> None:
    image = exact_image()
    image.tables["tweet_ids"] = {(str(n),): 1 for n in range(100, 108)}
    text = str(judge(image, expected_of_lines(LINES)))
    assert text.startswith("test: 4 records, 3 lost (tweet_ids '1': 0 of 1 times; ")
    assert "8 phantoms (tweet_ids '100', 1 times; " in text and "and 3 more)" in text


def test_midway_a_record_not_yet_counted_and_a_zero_row_are_not_wrong_yet() -> None:
    image = exact_image()
    del image.tables["tweet_ids"][("2",)]  # tweet 2 not committed yet
    image.tables["hashtags"] = {("#a",): 1, ("#b",): 0}  # #b undone, not yet deleted
    image.dead_letters.clear()
    assert judge(image, expected_of_lines(LINES), midway=True).exact
    final = judge(image, expected_of_lines(LINES))
    assert final.lost == ("tweet_ids '2': 0 of 1 times", "dead letter 'not json': 0 of 1 times")
    assert final.miscounted == ("hashtags '#a': 1, not 2", "hashtags '#b': 0, not 1")


def test_midway_a_duplicate_a_phantom_and_a_count_past_the_records_are_wrong() -> None:
    image = exact_image()
    del image.tables["tweet_ids"][("1",)]
    image.tables["tweet_ids"][("3",)] += 1
    image.tables["tweet_ids"][("9",)] = 1
    image.tables["users"][("@u",)] = 2
    verdict = judge(image, expected_of_lines(LINES), midway=True)
    assert verdict.duplicated == ("tweet_ids '3': 2 times, not 1",)
    assert verdict.phantoms == ("tweet_ids '9', 1 times",)
    assert verdict.miscounted == ("users '@u': 2, not 1",)
    assert not (verdict.lost or verdict.leftovers)


def test_an_answer_is_compared_by_the_tables_declared_key_types() -> None:
    """A user's answer keeps its keys' own Python types; the sink's texts are matched to
    them by each table's declared key types, and a key of the wrong width is refused."""
    tables = [
        CounterTable("by_day", ("day", "shop"), key_types={"day": "date", "shop": "int"}),
        CounterTable("paid", ("shop",), value_type="decimal(10,2)"),
        CounterTable("orders", ("order",), key_types={"order": "long"}),
    ]
    day = dt.date(2026, 12, 6)
    answer = Answer(
        {"by_day": {(day, 7): 2}, "paid": {"7": Decimal("9.50")}, "orders": {41: 1, 42: 1}},
        ids="orders",
    )
    image = Image(
        "redis",
        tables={
            "by_day": {("2026-12-06", "7"): 2},
            "paid": {("7",): Decimal("9.50")},
            "orders": {("41",): 1, ("42",): 1},
        },
    )
    assert history.judge(image, answer, tables).exact
    assert answer.records == 2
    image.tables["by_day"][("2026-12-06", "7")] = 3
    image.tables["paid"][("7",)] = Decimal("9.49")
    del image.tables["orders"][("42",)]
    verdict = history.judge(image, answer, tables)
    assert verdict.miscounted == (
        "by_day ('2026-12-06', '7'): 3, not 2",
        "paid '7': 9.49, not 9.50",
    )
    assert verdict.lost == ("orders '42': 0 of 1 times",)
    with pytest.raises(ValueError, match=r"key 7 of table 'by_day' has 1 column\(s\), the table 2"):
        history.judge(image, Answer({"by_day": {7: 1}}), tables)
    with pytest.raises(ValueError, match="ids names 'nope'"):
        Answer({"by_day": {}}, ids="nope")


def test_a_commits_writer_note_carries_its_fence_token_and_nothing_else_reads_as_one() -> None:
    """The note a leadership writes with each commit (``CommitterContext.writer_note``)
    is the JSON object ``{"fence": N}``, which ``noted_fence`` reads back; a commit
    without one, or with a note of anyone else's, has no token."""
    from transactional.committer import CommitterContext, noted_fence

    led = CommitterContext(spark=None, topology_id="t", name="delta", fence_token=7)
    assert json.loads(led.writer_note or "") == {"fence": 7}
    assert noted_fence(led.writer_note) == 7
    assert CommitterContext(spark=None, topology_id="t", name="delta").writer_note is None
    for other in (None, "", "not json", '{"fence": "7"}', '{"owner": 7}', "[7]"):
        assert noted_fence(other) is None
