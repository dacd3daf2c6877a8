"""Bad records through the demo: every one reaches the dead letters exactly once, with
its reason, even when its txid is committed twice; the good records around it are
counted exactly. The input is written here by hand, each bad line with the reason the
parse bolt's rule gives it."""

from __future__ import annotations

import io
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from examples.tweets.cli import main as demo
from tests.history import assert_exact, read_delta, read_redis
from tests.processes import run_summary
from tests.reference import Expected, expected_counts
from transactional.faults import FaultPoint, RandomFaults

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

NOT_JSON = "not valid JSON"
NOT_UTF8 = "invalid UTF-8"
NOT_OBJECT = "not a JSON object"
BAD_ID = "id missing or not an integer"
BAD_TEXT = "text missing or not a string"
BIG = 10 << 20  # a 10 MiB line

#: Lines per partition file per txid; with 34 and 36 lines in the files, 2 txids.
BATCH = 20
TXIDS = 2


def _garbage() -> bytes:
    """Random bytes with NULs and no newline, that cannot be UTF-8 (it starts with 0xff)."""
    rng = random.Random(7)
    body = bytes(b for b in rng.randbytes(400) if b not in b"\r\n")
    return b"\xff\x00" + body + b"\x00"


def bad_lines() -> list[tuple[bytes, str]]:
    return [
        (b'{"id": 1, "text": "unterminated', NOT_JSON),
        (b'{"id": 2, "text": "#trailing"} junk', NOT_JSON),
        (b'{"id": 3, "text": "#nan", "x": NaN}', NOT_JSON),
        (b'{"id": 4, "id": 5, "text": "#dupkey"}', NOT_JSON),
        (b'{"id": 6, "text": "raw\x00nul"}', NOT_JSON),  # a control character in a string
        (b"", NOT_JSON),
        (b'\xff\xfe{"id": 8, "text": "#bom"}', NOT_UTF8),
        (b'{"id": 7, "text": "' + b"a" * BIG, NOT_JSON),  # 10 MiB, never closed
        (b'{"id": 9, "text": "caf\xc3"}', NOT_UTF8),
        (b'{"id": 10, "text": "\xed\xa0\x80 #surrogate"}', NOT_UTF8),
        (_garbage(), NOT_UTF8),
        (b'[{"id": 11, "text": "#inarray"}]', NOT_OBJECT),
        (b"[]", NOT_OBJECT),
        (b"42", NOT_OBJECT),
        (b"3.5", NOT_OBJECT),
        (b'"#string"', NOT_OBJECT),
        (b"null", NOT_OBJECT),
        (b"true", NOT_OBJECT),
        (b'{"text": "#noid"}', BAD_ID),
        (b'{"id": "12", "text": "#strid"}', BAD_ID),
        (b'{"id": 13.0, "text": "#floatid"}', BAD_ID),
        (b'{"id": 1e3, "text": "#expid"}', BAD_ID),
        (b'{"id": true, "text": "#boolid"}', BAD_ID),
        (b'{"id": null, "text": "#nullid"}', BAD_ID),
        (b'{"id": 9223372036854775808, "text": "#bigid"}', BAD_ID),
        (b'{"id": -9223372036854775809, "text": "#smallid"}', BAD_ID),
        (b'{"id": 14}', BAD_TEXT),
        (b'{"id": 15, "text": 16}', BAD_TEXT),
        (b'{"id": 17, "text": null}', BAD_TEXT),
        (b'{"id": 18, "text": {"t": "#obj"}}', BAD_TEXT),
        (b'{"id": 19, "text": ["#arr"]}', BAD_TEXT),
    ]


def good_lines() -> list[bytes]:
    tweets = [
        {"id": 100 + i, "text": f"tweet {i} #tag{i % 3} @user{i % 4} #common"} for i in range(36)
    ]
    tweets.append({"id": 2**63 - 1, "text": "largest id #edge @max"})
    tweets.append({"id": -(2**63), "text": "smallest id #edge @min"})
    # 10 MiB of text, and still a tweet.
    tweets.append({"id": 999, "text": "#big " + "x" * BIG + " @huge #big"})
    return [json.dumps(t).encode() for t in tweets]


@pytest.fixture(scope="module")
def mixed_input(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected, Counter[Any]]:
    """Two partition files; bad lines spread over both and over every txid, good ones
    before and after them (the last lines of each file are good)."""
    good, bad = good_lines(), bad_lines()
    assert len(bad) < len(good) - 6
    out = tmp_path_factory.mktemp("bad-input") / "tweets"
    out.mkdir()
    for p in range(2):
        lines: list[bytes] = []
        for i, line in enumerate(good[p::2]):
            lines.append(line)
            if i < len(bad[p::2]):
                lines.append(bad[p::2][i][0])
        (out / f"part-{p:05d}.jsonl").write_bytes(b"".join(x + b"\n" for x in lines))
    expected = expected_counts(out)
    labelled = Counter((raw.decode("utf-8", "backslashreplace"), why) for raw, why in bad)
    # The independent reference agrees with the labels on which lines are dead letters.
    assert Counter(expected.dead_letters) == Counter(raw for raw, _ in labelled.elements())
    assert expected.tweets == len(good) and expected.hashtags["#big"] == 1
    return out, expected, labelled


def replay_seed(replayed: set[int]) -> int:
    """A ``--fail-rate 0.3`` seed under which the first attempt of each txid in
    ``replayed`` fails after the sink write (so it is committed twice) and its second
    succeeds, while the other txids succeed at once."""
    for seed in range(100_000):
        plan = RandomFaults(0.3, seed)
        if all(
            (plan.planned(t, 1), plan.planned(t, 2)) == (FaultPoint.AFTER_SINK_WRITE, None)
            if t in replayed
            else plan.planned(t, 1) is None
            for t in range(1, TXIDS + 1)
        ):
            return seed
    raise AssertionError("no seed found")


def redis_dead_letters(url: str) -> Counter[Any]:
    client = redis.Redis.from_url(url, decode_responses=True)
    items = [json.loads(v) for v in client.lrange("dead_letters", 0, -1)]  # type: ignore[union-attr]
    client.close()
    return Counter((d["raw"], d["reason"]) for d in items)


def delta_dead_letters(spark: Any, path: Path) -> Counter[Any]:
    rows = spark.read.format("delta").load(str(path / "dead_letters")).collect()
    return Counter((r["raw"], r["reason"]) for r in rows)


# Delta is the slow sink: it runs once, with the opaque spout, whose replay of txid 2
# must rewrite that txid's dead letters and keep txid 1's (transactional-mode sinks
# skip a replayed txid whole).
@pytest.mark.parametrize(
    ("spout", "sink", "replayed"),
    [("partitioned", "redis", {1, 2}), ("opaque", "both", {2})],
    ids=["partitioned-redis", "opaque-both"],
)
@pytest.mark.rotated
def test_bad_records_are_dead_letters_exactly_once_through_replays(
    spark: Any,
    redis_url: str,
    mixed_input: tuple[Path, Expected, Counter[Any]],
    tmp_path: Path,
    spout: str,
    sink: str,
    replayed: set[int],
) -> None:
    path, expected, labelled = mixed_input
    seed = replay_seed(replayed)
    delta = ["--delta-path", str(tmp_path / "delta")] if sink == "both" else []
    out = io.StringIO()
    code = demo(
        [
            "run",
            "--input",
            str(path),
            "--spout",
            spout,
            "--sink",
            sink,
            "--redis-url",
            redis_url,
            *delta,
            "--state-dir",
            str(tmp_path / "state"),
            "--batch-size",
            str(BATCH),
            "--max-pending",
            "1",
            "--fail-rate",
            "0.3",
            "--fail-seed",
            str(seed),
            "--until-drained",
            "--master",
            "local[2]",
            "--top",
            "0",
        ],
        out=out,
    )
    assert code == 0, out.getvalue()
    stats = run_summary(out.getvalue())
    # Each replayed txid was committed, failed before the store advanced, and committed again.
    assert (stats["committed_txids"], stats["failures"]) == (TXIDS, len(replayed))

    assert_exact(read_redis(redis_url), expected, ids=False)
    assert redis_dead_letters(redis_url) == labelled
    if sink == "both":
        assert_exact(read_delta(tmp_path / "delta"), expected, ids=False)
        assert delta_dead_letters(spark, tmp_path / "delta") == labelled
