"""The record-history checker (``tests.history``) finds each kind of wrong it names, in
images built here by hand from a small input whose answer is written out below."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.history import Image, MissingIds, assert_exact, judge
from tests.reference import expected_of_lines

LINES = [
    json.dumps({"id": 1, "text": "#a @u"}).encode(),
    json.dumps({"id": 2, "text": "#a #b"}).encode(),
    b"not json",
    json.dumps({"id": 3, "text": "@v"}).encode(),
]


def exact_image() -> Image:
    """What a sink that took every record once holds, counted by hand from ``LINES``."""
    return Image(
        "test",
        counts={
            "hashtags": Counter({"#a": 2, "#b": 1}),
            "users": Counter({"@u": 1, "@v": 1}),
            "pairs": Counter({("@u", "#a"): 1}),
            "ids": Counter({1: 1, 2: 1, 3: 1}),
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
    del image.counts["ids"][2]
    image.counts["hashtags"] = Counter({"#a": 1})  # tweet 2's #a and #b missing
    verdict = judge(image, expected_of_lines(LINES))
    assert verdict.lost == ("tweet 2: 0 of 1 times",)
    assert verdict.miscounted == ("hashtags '#a': 1, not 2", "hashtags '#b': 0, not 1")
    assert not (verdict.duplicated or verdict.phantoms or verdict.leftovers)
    assert not verdict.exact


def test_a_record_counted_twice_is_a_duplicate() -> None:
    image = exact_image()
    image.counts["ids"][3] += 1
    image.counts["users"]["@v"] += 1
    image.dead_letters.append("not json")
    verdict = judge(image, expected_of_lines(LINES))
    assert verdict.duplicated == (
        "tweet 3: 2 times, not 1",
        "bad line 'not json': 2 times, not 1",
    )
    assert verdict.miscounted == ("users '@v': 2, not 1",)
    assert verdict.figures()["duplicated"] == 2 and not verdict.lost


def test_what_no_record_explains_is_a_phantom_and_a_zero_row_a_leftover() -> None:
    image = exact_image()
    image.counts["ids"][99] = 1
    image.counts["hashtags"]["#z"] = 3
    image.counts["users"]["@gone"] = 0  # an undone attempt's key, not deleted
    image.counts["ids"][98] = 0
    image.dead_letters.append("never in the input")
    image.strange.append("key 'x'")
    image.leftovers.append("staging key 's'")
    verdict = judge(image, expected_of_lines(LINES))
    assert verdict.phantoms == (
        "key 'x'",
        "tweet 99, 1 times",
        "bad line 'never in the input', 1 times",
        "hashtags '#z' counting 3",
    )
    assert verdict.leftovers == (
        "staging key 's'",
        "tweet 98 counting 0",
        "users '@gone' counting 0",
    )
    assert not (verdict.lost or verdict.duplicated or verdict.miscounted)


def test_an_input_that_holds_a_tweet_twice_wants_it_twice() -> None:
    lines = [*LINES, LINES[0]]
    image = exact_image()
    verdict = judge(image, expected_of_lines(lines))
    assert verdict.lost == ("tweet 1: 1 of 2 times",)
    image.counts["ids"][1] = 2
    image.counts["hashtags"]["#a"] = 3
    image.counts["users"]["@u"] = 2
    image.counts["pairs"][("@u", "#a")] = 2
    assert judge(image, expected_of_lines(lines)).exact


def test_a_sink_without_record_ids_fails_the_check() -> None:
    image = exact_image()
    del image.counts["ids"]
    with pytest.raises(MissingIds, match="--record-ids"):
        judge(image, expected_of_lines(LINES))


def test_a_run_without_record_ids_is_judged_by_its_tables_and_dead_letters() -> None:
    image = exact_image()
    del image.counts["ids"]
    assert_exact(image, expected_of_lines(LINES), ids=False)
    image.counts["pairs"][("@u", "#a")] = 0  # an undone attempt's row, not deleted
    image.dead_letters.append("not json")
    verdict = judge(image, expected_of_lines(LINES), ids=False)
    assert verdict.miscounted == ("pairs ('@u', '#a'): 0, not 1",)
    assert verdict.duplicated == ("bad line 'not json': 2 times, not 1",)
    with pytest.raises(AssertionError, match=r"1 duplicated .*1 miscounted"):
        assert_exact(image, expected_of_lines(LINES), ids=False)
    # Ids in a sink the test says were not counted: a table no such run writes.
    with pytest.raises(AssertionError, match=r"1 phantoms \(tweet_ids: 3 ids"):
        assert_exact(exact_image(), expected_of_lines(LINES), ids=False)


def test_the_text_of_a_verdict_shows_a_few_of_each() -> None:
    image = exact_image()
    image.counts["ids"] = Counter()
    image.counts["ids"].update({n: 1 for n in range(100, 108)})
    text = str(judge(image, expected_of_lines(LINES)))
    assert text.startswith("test: 4 records, 3 lost (tweet 1: 0 of 1 times; ")
    assert "8 phantoms (tweet 100, 1 times; " in text and "and 3 more)" in text


def test_midway_a_record_not_yet_counted_and_a_zero_row_are_not_wrong_yet() -> None:
    image = exact_image()
    del image.counts["ids"][2]  # tweet 2 not committed yet
    image.counts["hashtags"] = Counter({"#a": 1, "#b": 0})  # #b undone, not yet deleted
    image.dead_letters.clear()
    assert judge(image, expected_of_lines(LINES), midway=True).exact
    final = judge(image, expected_of_lines(LINES))
    assert final.lost == ("tweet 2: 0 of 1 times", "bad line 'not json': 0 of 1 times")
    assert final.miscounted == ("hashtags '#a': 1, not 2", "hashtags '#b': 0, not 1")


def test_midway_a_duplicate_a_phantom_and_a_count_past_the_records_are_wrong() -> None:
    image = exact_image()
    del image.counts["ids"][1]
    image.counts["ids"][3] += 1
    image.counts["ids"][9] = 1
    image.counts["users"]["@u"] = 2
    verdict = judge(image, expected_of_lines(LINES), midway=True)
    assert verdict.duplicated == ("tweet 3: 2 times, not 1",)
    assert verdict.phantoms == ("tweet 9, 1 times",)
    assert verdict.miscounted == ("users '@u': 2, not 1",)
    assert not (verdict.lost or verdict.leftovers)
