"""Synthetic tweets as JSON Lines: deterministic for a seed, with a skewed (Zipf-like)
popularity of hashtags and users, texts full of tokens that trip naive counters, and
optionally bad lines of every kind the parse bolt must send to the dead letters.

Everything is drawn from one ``random.Random(seed)`` in a fixed order, so the same
arguments give the same bytes on any machine and Python version (``random()`` and
``choices`` are stable for an integer seed).
"""

from __future__ import annotations

import itertools
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

__all__ = ["BAD_KINDS", "generate", "generate_lines", "partition_name"]


def _split(words: str) -> list[str]:
    return words.split()


_WORDS = _split(
    "the a of to and in is it you that was for on are with as be at have this from "
    "or one had by word but not what all were we when your can said there use an each "
    "which she do how their if will up other about out many then them these so some her "
    "would make like him into time has look two more write go see number no way could "
    "people my than first water been call who oil its now find long down day did get "
    "come made may part café naïve über straße 日本 東京 привет мир añejo résumé"
)
_TOPICS = _split(
    "spark storm kafka flink data bigdata ml ai python java scala sql redis zookeeper "
    "delta lake cloud devops rust go music news sports football travel food coffee cats "
    "dogs art photo love life tbt mondaymotivation weekend summer winter science space "
    "café über naïve 日本 東京 москва Ünïcode straße"
)
_NAMES = _split(
    "alice bob carol dave erin frank grace heidi ivan judy mallory niaj olivia peggy "
    "rupert sybil trent victor walter zoë jörg søren 太郎 maría"
)
#: Separators between words: mostly spaces, sometimes the other ASCII whitespace the
#: rule splits on, sometimes Unicode spaces it must not split on.
_SEPARATORS = [" "] * 12 + ["\t", "  ", " \t ", "\n", "\r\n", "\x0b", "\x0c", "\u00a0", "\u3000"]
_PUNCTUATION = [",", ".", "!", "?", ":", ";", ")", "…"]

#: Kinds of bad lines, each a different reason (or a trap) for the parse bolt.
BAD_KINDS = (
    "truncated",
    "array",
    "scalar",
    "trailing_data",
    "duplicate_key",
    "nan",
    "lone_surrogate",
    "id_missing",
    "id_string",
    "id_bool",
    "id_float",
    "id_huge",
    "id_null",
    "text_missing",
    "text_number",
    "text_null",
    "text_object",
    "invalid_utf8",
    "blank",
)


def _zipf(names: list[str], s: float) -> list[float]:
    """Cumulative weights ``1 / rank**s``: a few names take most of the draws."""
    return list(itertools.accumulate(1.0 / (rank**s) for rank in range(1, len(names) + 1)))


class _Vocabulary:
    def __init__(self) -> None:
        tags = [f"#{t}" for t in _TOPICS]
        tags += [f"#{t.capitalize()}" for t in _TOPICS[:8]] + [f"#{t.upper()}" for t in _TOPICS[:4]]
        tags += [f"#topic{n}" for n in range(300)]
        users = [f"@{n}" for n in _NAMES] + [f"@user{n}" for n in range(2000)]
        self.tags, self.tag_weights = tags, _zipf(tags, 1.1)
        self.users, self.user_weights = users, _zipf(users, 1.05)


def _text(rng: random.Random, vocab: _Vocabulary) -> str:
    tokens = [rng.choice(_WORDS) for _ in range(rng.randint(2, 12))]
    tokens += rng.choices(vocab.tags, cum_weights=vocab.tag_weights, k=rng.choice((0, 1, 1, 2, 3)))
    tokens += rng.choices(vocab.users, cum_weights=vocab.user_weights, k=rng.choice((0, 1, 1, 2)))
    roll = rng.random()
    if roll < 0.08 and any(t.startswith("#") for t in tokens):
        tokens.append(next(t for t in tokens if t.startswith("#")))  # repeated in one tweet
    elif roll < 0.14:
        tokens.append(rng.choice(("#", "@", "##", "#@", "@#x", "#\u00a0", "😀#fun")))
    elif roll < 0.20:
        tokens.append(rng.choice(vocab.tags) + rng.choice(_PUNCTUATION))
    elif roll < 0.23:
        tokens.append(rng.choice(vocab.users) + rng.choice(_PUNCTUATION))
    rng.shuffle(tokens)
    text = tokens[0]
    for token in tokens[1:]:
        text += rng.choice(_SEPARATORS) + token
    if rng.random() < 0.05:
        text = rng.choice(_SEPARATORS) + text + rng.choice(_SEPARATORS)
    return text


def _tweet(rng: random.Random, vocab: _Vocabulary, index: int) -> dict[str, object]:
    # Snowflake-like ids above 2**53: a reader that goes through doubles loses them.
    return {
        "id": 1_600_000_000_000_000_000 + index * 4096 + rng.randrange(4096),
        "text": _text(rng, vocab),
        "user": rng.choices(vocab.users, cum_weights=vocab.user_weights)[0][1:],
        "lang": rng.choice(("en", "en", "en", "de", "fr", "ja", "ru", "es")),
        "created_at": 1_700_000_000 + index,
    }


def _dumps(rng: random.Random, value: object) -> str:
    return json.dumps(value, ensure_ascii=rng.random() < 0.3)


def _bad(rng: random.Random, kind: str, tweet: dict[str, object]) -> bytes:
    good = _dumps(rng, tweet)
    text = json.dumps(tweet["text"])
    replaced: dict[str, object] = {
        "id_string": {**tweet, "id": str(tweet["id"])},
        "id_bool": {**tweet, "id": True},
        "id_float": {**tweet, "id": float(rng.randrange(1000))},
        "id_huge": {**tweet, "id": 2**64 + rng.randrange(1000)},
        "id_null": {**tweet, "id": None},
        "id_missing": {k: v for k, v in tweet.items() if k != "id"},
        "text_number": {**tweet, "text": rng.randrange(1000)},
        "text_null": {**tweet, "text": None},
        "text_object": {**tweet, "text": {"body": tweet["text"]}},
        "text_missing": {k: v for k, v in tweet.items() if k != "text"},
        "array": [tweet["id"], tweet["text"]],
        "scalar": tweet["text"],
    }
    if kind in replaced:
        return _dumps(rng, replaced[kind]).encode()
    line = {
        "truncated": good[: rng.randrange(1, len(good) - 1)],
        "trailing_data": good + rng.choice((" x", "}", "]", ", 1", ' {"id": 1}')),
        "duplicate_key": f'{{"id": {tweet["id"]}, "text": {text}, "id": 7}}',
        "nan": f'{{"id": {tweet["id"]}, "text": {text}, "score": NaN}}',
        "lone_surrogate": f'{{"id": {tweet["id"]}, "text": "broken \\ud83d pair"}}',
        "blank": "",
    }.get(kind)
    if line is not None:
        return line.encode()
    if kind == "invalid_utf8":
        raw = good.encode()
        cut = raw.rindex(b'"')  # inside the last string value
        return (
            raw[:cut] + rng.choice((b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xe2\x82")) + raw[cut:]
        )
    raise ValueError(f"unknown bad kind {kind!r}")


def generate_lines(count: int, seed: int, bad_rate: float = 0.0) -> Iterator[bytes]:
    """``count`` lines (without their newline); each is bad with probability ``bad_rate``."""
    if not 0.0 <= bad_rate <= 1.0:
        raise ValueError(f"bad_rate must be within [0, 1], not {bad_rate}")
    rng = random.Random(seed)
    vocab = _Vocabulary()
    for index in range(count):
        tweet = _tweet(rng, vocab, index)
        if bad_rate and rng.random() < bad_rate:
            yield _bad(rng, rng.choice(BAD_KINDS), tweet)
        else:
            yield _dumps(rng, tweet).encode()


def partition_name(partition: int) -> str:
    return f"part-{partition:05d}.jsonl"


def generate(
    out: str | os.PathLike[str],
    count: int,
    seed: int,
    partitions: int | None = None,
    bad_rate: float = 0.0,
) -> list[Path]:
    """Write the lines to ``out`` (one file), or round-robin to ``partitions`` files in
    the directory ``out``; returns the files written. Every line ends with a newline."""
    target = Path(out)
    if partitions is None:
        target.parent.mkdir(parents=True, exist_ok=True)
        paths = [target]
    else:
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, not {partitions}")
        target.mkdir(parents=True, exist_ok=True)
        paths = [target / partition_name(p) for p in range(partitions)]
    files = [open(p, "wb") for p in paths]  # noqa: SIM115 - closed below
    try:
        for index, line in enumerate(generate_lines(count, seed, bad_rate)):
            files[index % len(files)].write(line + b"\n")
    finally:
        for f in files:
            f.close()
    return paths
