"""ParseTweets and CountTags against an answer computed here in plain Python: every
tweet, every dead letter with its reason, and every count must match exactly."""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from itertools import product
from pathlib import Path
from typing import Any

import pytest

from examples.tweets.bolts import CountTags, ParseTweets
from examples.tweets.generate import generate
from transactional.ledger import COLUMNS, FOLDED, ID, XOR, Tally, with_ids
from transactional.types import TransactionAttempt

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

pytestmark = [pytest.mark.integration, pytest.mark.connect]

ASCII_WHITESPACE = re.compile(r"[ \t\n\r\x0b\x0c]+")
ATTEMPT = TransactionAttempt(1, 1)

#: Lines whose reason is stated by hand, so the rule itself is pinned down, not only the
#: agreement between two implementations of it.
HAND_WRITTEN: list[tuple[bytes, str | None]] = [
    (b'{"id": 1, "text": "#ok"}', None),
    (b' \t{"id": -0, "text": ""}\t ', None),
    (b'{"id": 9223372036854775807, "text": "max"}', None),
    (b'{"id": 5, "text": "a", "text2": null, "id2": "x"}', None),
    (b'{"id": 7, "text": "\\ud83d\\ude00 #emoji \\u00e9"}', None),
    (b'{"id": 1, "text": "a"} junk', "not valid JSON"),
    (b'{"id": 1, "text": "a"}}', "not valid JSON"),
    (b'{"id": 1, "text": "a"}]', "not valid JSON"),
    (b'{"id": 1, "text": "a"}, 2', "not valid JSON"),
    (b'{"id": 1, "text": "a"}, null', "not valid JSON"),
    (b'{"id": 1, "text": "a"}], [', "not valid JSON"),
    (b'{"id": 1, "text": "a"}, null]', "not valid JSON"),
    (b'{"id": 3, "text": "[link] #tag]"}', None),
    (b'{"id": 4, "text": "a", "more": [1, [2]]}', None),
    # Tokens: only a whole token counts, by ASCII whitespace alone ("a#b", "x@y" are
    # not tags; a no-break space and U+3000 are part of a token); "#" or "@" alone is
    # not a tag, "##" and "#@u" are; a tag may end the text or be followed by \x0b;
    # an emoji (a surrogate pair in JSON) is one character.
    (b'{"id": 8, "text": "a#b x@y #\u00a0nb @\u3000w # @ ## #@u\u000b@@ @u\\f#t#t"}', None),
    (b'{"id": 9, "text": "\\t#first\\r\\n@\ud83d\ude00 #\ud83d\ude00x #last"}', None),
    (b"[{}]", "not a JSON object"),
    (b" \t ", "not valid JSON"),
    (b'{"id": 1, "text": "a"}, "b": 2', "not valid JSON"),
    (b'{"id": 1, "text": "a", "id": 2}', "not valid JSON"),
    (b'{"id": NaN, "text": "a"}', "not valid JSON"),
    (b'{"id": 1, "text": "\\udc00"}', "not valid JSON"),
    (b"{'id': 1, 'text': 'a'}", "not valid JSON"),
    (b'{"id": 01, "text": "a"}', "not valid JSON"),
    (b"", "not valid JSON"),
    (b"\xef\xbb\xbf{}", "not valid JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'"text"', "not a JSON object"),
    (b"null", "not a JSON object"),
    (b"{}", "id missing or not an integer"),
    (b'{"ID": 1, "text": "a"}', "id missing or not an integer"),
    (b'{"id": true, "text": "a"}', "id missing or not an integer"),
    (b'{"id": 1.0, "text": "a"}', "id missing or not an integer"),
    (b'{"id": 1e3, "text": "a"}', "id missing or not an integer"),
    (b'{"id": "1", "text": "a"}', "id missing or not an integer"),
    (b'{"id": null, "text": "a"}', "id missing or not an integer"),
    (b'{"id": 9223372036854775808, "text": "a"}', "id missing or not an integer"),
    (b'{"id": 1}', "text missing or not a string"),
    (b'{"id": 1, "text": 5}', "text missing or not a string"),
    (b'{"id": 1, "text": null}', "text missing or not a string"),
    (b'{"id": 1, "text": ["a"]}', "text missing or not a string"),
    (b'{"id": 1, "text": "caf\xe9"}', "invalid UTF-8"),
]


class _Invalid(ValueError):
    pass


def _reject(value: str) -> None:
    raise _Invalid(value)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({k for k, _ in pairs}) != len(pairs):
        raise _Invalid("duplicate key")
    for key, value in pairs:
        for s in (key, value):
            if isinstance(s, str):
                s.encode("utf-8")  # a lone surrogate escape raises
            elif isinstance(s, list):
                for item in s:
                    if isinstance(item, str):
                        item.encode("utf-8")
    return dict(pairs)


def reference(line: bytes) -> tuple[str, str | None, Any]:
    """``(raw, reason, tweet)`` for one line, from the rule as the docs state it."""
    line = line[:-1] if line.endswith(b"\r") else line
    try:
        raw = line.decode("utf-8")
    except UnicodeDecodeError:
        return line.decode("utf-8", "backslashreplace"), "invalid UTF-8", None
    try:
        obj = json.loads(raw, parse_constant=_reject, object_pairs_hook=_object)
        if isinstance(obj, str | list):
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except ValueError:  # JSONDecodeError, _Invalid, UnicodeEncodeError
        return raw, "not valid JSON", None
    if not isinstance(obj, dict):
        return raw, "not a JSON object", None
    tweet_id, text = obj.get("id"), obj.get("text")
    if type(tweet_id) is not int or not -(2**63) <= tweet_id < 2**63:
        return raw, "id missing or not an integer", None
    if type(text) is not str:
        return raw, "text missing or not a string", None
    return raw, None, (tweet_id, text)


@pytest.fixture
def lines(tmp_path: Path) -> list[bytes]:
    path = generate(tmp_path / "tweets.jsonl", 600, seed=21, bad_rate=0.3)[0]
    with open(path, "ab") as f:
        for line, _ in HAND_WRITTEN:
            f.write(line + b"\r\n")
    data = path.read_bytes()
    return data.split(b"\n")[:-1]


def _spout_frame(spark: Any, lines: list[bytes]) -> Any:
    rows = []
    for line in lines:
        raw, reason, _ = reference(line)
        rows.append((raw, "invalid UTF-8" if reason == "invalid UTF-8" else None))
    return spark.createDataFrame(rows, "raw STRING, error STRING")


def test_hand_written_reasons() -> None:
    for line, reason in HAND_WRITTEN:
        assert reference(line)[1] == reason, line


def test_parse_and_count_match_the_reference(spark: Any, lines: list[bytes]) -> None:
    given = with_ids(_spout_frame(spark, lines)).localCheckpoint()
    ids = [r[ID] for r in given.collect()]  # in the lines' order
    accounted = ParseTweets().process(ATTEMPT, given)
    assert set(accounted) == {"default", "dead_letters"}
    counter = CountTags()
    folds = counter.finish_batch(ATTEMPT, counter.process(ATTEMPT, accounted["default"]))
    parsed = {name: frame.drop(*COLUMNS) for name, frame in accounted.items()}
    counted = {name: frame.drop(*COLUMNS) for name, frame in folds.items()}

    tweets, dead = [], []
    hashtags: Counter[str] = Counter()
    users: Counter[str] = Counter()
    pairs: Counter[tuple[str, str]] = Counter()
    # The ledger: each line's id goes on with its tweet or its dead letter, and each
    # tweet is folded once into each stream where it has a token (or a pair).
    carried: dict[str, Tally] = {"default": Tally(), "dead_letters": Tally()}
    folded = {"hashtags": Tally(), "users": Tally(), "users_hashtags": Tally()}
    for line, record in zip(lines, ids, strict=True):
        raw, reason, tweet = reference(line)
        if tweet is None:
            dead.append((raw, reason))
            carried["dead_letters"] += Tally.of(1, record)
            continue
        carried["default"] += Tally.of(1, record)
        tweets.append(tweet)
        tokens = [t for t in ASCII_WHITESPACE.split(tweet[1]) if t]
        tags = {t for t in tokens if t.startswith("#") and len(t) >= 2}
        mentions = {t for t in tokens if t.startswith("@") and len(t) >= 2}
        hashtags.update(tags)
        users.update(mentions)
        pairs.update(product(mentions, tags))
        for stream, has in (("hashtags", tags), ("users", mentions), ("users_hashtags", tags)):
            if has and (stream != "users_hashtags" or mentions):
                folded[stream] += Tally.of(1, record)
    for name, expected in carried.items():
        rows = accounted[name].select(ID).collect()
        assert sum((Tally.of(1, r[ID]) for r in rows), Tally()) == expected, name
    for name, expected in folded.items():
        rows = folds[name].select(FOLDED, XOR).collect()
        assert sum((Tally.of(r[FOLDED], r[XOR]) for r in rows), Tally()) == expected, name

    assert parsed["default"].schema.simpleString() == "struct<id:bigint,text:string>"
    assert parsed["dead_letters"].schema.simpleString() == "struct<raw:string,reason:string>"
    assert sorted(tuple(r) for r in parsed["default"].collect()) == sorted(tweets)
    assert sorted(tuple(r) for r in parsed["dead_letters"].collect()) == sorted(dead)
    assert {reason for _, reason in dead} == {
        "invalid UTF-8",
        "not valid JSON",
        "not a JSON object",
        "id missing or not an integer",
        "text missing or not a string",
    }

    schemas = {name: frame.schema.simpleString() for name, frame in counted.items()}
    assert schemas == {
        "hashtags": "struct<hashtag:string,count:bigint>",
        "users": "struct<user:string,count:bigint>",
        "users_hashtags": "struct<user:string,hashtag:string,count:bigint>",
    }
    assert {r.hashtag: r["count"] for r in counted["hashtags"].collect()} == hashtags
    assert {r.user: r["count"] for r in counted["users"].collect()} == users
    got_pairs = {(r.user, r.hashtag): r["count"] for r in counted["users_hashtags"].collect()}
    assert got_pairs == pairs
    # The data exercises the traps the rule is about.
    assert any("\u00a0" in t for t in hashtags) or any("\u00a0" in t for t in users)
    assert any(t[-1] in ",.!?;:)…" for t in hashtags)
    assert "#" not in hashtags and "@" not in users
