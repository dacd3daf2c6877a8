"""The generator's promises: same seed, same bytes; the partition layout the spouts and
``load`` rely on; a skewed popularity; and bad lines of every kind when asked."""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter
from pathlib import Path

import pytest

from examples.tweets.generate import BAD_KINDS, generate, generate_lines

WHITESPACE = re.compile(r"[ \t\n\r\x0b\x0c]+")


def _strict_text(line: bytes) -> str | None:
    """The text of a good tweet line, None for a bad one (strict JSON, 64-bit id)."""

    def reject(value: str) -> None:
        raise ValueError(value)

    def no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        if len({k for k, _ in pairs}) != len(pairs):
            raise ValueError("duplicate key")
        return dict(pairs)

    try:
        obj = json.loads(
            line.decode("utf-8"), parse_constant=reject, object_pairs_hook=no_duplicates
        )
        if isinstance(obj, dict):
            json.dumps(obj, ensure_ascii=False).encode("utf-8")  # no lone surrogates
    except ValueError:  # also UnicodeDecodeError / UnicodeEncodeError
        return None
    if not isinstance(obj, dict):
        return None
    tweet_id, text = obj.get("id"), obj.get("text")
    if type(tweet_id) is not int or not -(2**63) <= tweet_id < 2**63 or type(text) is not str:
        return None
    return text


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = generate(tmp_path / "a.jsonl", 500, seed=3, bad_rate=0.1)[0].read_bytes()
    b = generate(tmp_path / "b.jsonl", 500, seed=3, bad_rate=0.1)[0].read_bytes()
    c = generate(tmp_path / "c.jsonl", 500, seed=4, bad_rate=0.1)[0].read_bytes()
    assert a == b
    assert a != c
    assert a.endswith(b"\n") and a.count(b"\n") == 500


def test_partitions_are_round_robin_files_of_whole_lines(tmp_path: Path) -> None:
    paths = generate(tmp_path / "parts", 1001, seed=1, partitions=4)
    assert [p.name for p in paths] == [f"part-{i:05d}.jsonl" for i in range(4)]
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == [p.name for p in paths]
    single = list(generate_lines(1001, seed=1))
    for partition, path in enumerate(paths):
        data = path.read_bytes()
        assert data.endswith(b"\n")
        assert data.split(b"\n")[:-1] == single[partition::4]


def test_hashtags_and_users_are_skewed() -> None:
    hashtags: Counter[str] = Counter()
    users: Counter[str] = Counter()
    for line in generate_lines(5000, seed=42):
        text = _strict_text(line)
        assert text is not None, line  # bad_rate 0: every line is a tweet
        tokens = {t for t in WHITESPACE.split(text) if t}
        hashtags.update(t for t in tokens if t.startswith("#") and len(t) >= 2)
        users.update(t for t in tokens if t.startswith("@") and len(t) >= 2)
    for counts in (hashtags, users):
        top = counts.most_common(1)[0][1]
        assert top >= 20 * statistics.median(counts.values())
        assert len(counts) > 100  # a long tail, not a handful of names


def test_texts_hold_the_tricky_tokens() -> None:
    texts = [t for line in generate_lines(3000, seed=5) if (t := _strict_text(line)) is not None]
    joined = "\n".join(texts)
    assert any("\t" in t for t in texts)
    assert any("\u00a0" in t for t in texts)  # a Unicode space the rule does not split on
    assert any(re.search(r"#\w+[,.!?;:]", t) for t in texts)
    assert any(re.search(r"(^|\s)#(\s|$)", t) for t in texts)  # a lone '#'
    assert any(not t.isascii() for t in texts)
    assert re.search(r"#[A-Z]", joined) and re.search(r"#[a-z]", joined)
    repeated = [t for t in texts if len(tags := re.findall(r"#\S+", t)) > len(set(tags))]
    assert repeated


@pytest.mark.parametrize("bad_rate", [0.0, 0.3])
def test_bad_rate_mixes_in_every_kind_of_bad_line(bad_rate: float) -> None:
    lines = list(generate_lines(3000, seed=9, bad_rate=bad_rate))
    bad = [line for line in lines if _strict_text(line) is None]
    if bad_rate == 0:
        assert bad == []
        return
    assert 0.2 * len(lines) < len(bad) < 0.4 * len(lines)
    assert any(b"\xff" in line or b"\xc3\x28" in line or b"\xed\xa0\x80" in line for line in bad)
    assert b"" in bad
    assert any(line.startswith(b"[") for line in bad)
    assert any(b'"id": true' in line for line in bad)
    assert any(b'"id": "' in line for line in bad)
    assert len(BAD_KINDS) >= 15


def test_bad_rate_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="bad_rate"):
        list(generate_lines(1, seed=0, bad_rate=1.5))
