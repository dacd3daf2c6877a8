"""``load`` refuses to queue an input twice: a second load into queues that hold
messages exits 2 and writes nothing; ``--append`` adds the lines on purpose."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import redis

from examples.tweets.cli import main as demo
from examples.tweets.lines import counter_key, message_key

pytestmark = pytest.mark.integration


def snapshot(url: str) -> dict[bytes, bytes]:
    client = redis.Redis.from_url(url)
    try:
        return {k: client.get(k) for k in sorted(client.keys("*"))}  # type: ignore[misc]
    finally:
        client.close()


def test_a_second_load_is_refused_and_append_adds_on_purpose(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "tweets"
    data.mkdir()
    (data / "a.jsonl").write_text('{"id": 1, "text": "#x"}\n{"id": 2, "text": "#y"}\n')
    (data / "b.jsonl").write_text('{"id": 3, "text": "#z"}\n')
    args = ["load", "--input", str(data), "--redis-url", redis_url]
    assert demo(args, out=io.StringIO()) == 0
    first = snapshot(redis_url)
    assert first[counter_key("tweets", 0).encode()] == b"2"
    assert first[message_key("tweets", 1, 0).encode()] == b'{"id": 3, "text": "#z"}'
    capsys.readouterr()

    assert demo(args, out=io.StringIO()) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: the Redis queues tweets:* already hold 3 messages (tweets:0: 2, tweets:1: 1); "
        "loading again would queue every line a second time. Pass --append to add them "
        "anyway, or load into another --prefix"
    )
    assert snapshot(redis_url) == first  # nothing written

    assert demo([*args, "--append"], out=io.StringIO()) == 0
    after = snapshot(redis_url)
    assert after[counter_key("tweets", 0).encode()] == b"4"
    assert after[message_key("tweets", 0, 2).encode()] == b'{"id": 1, "text": "#x"}'
    assert demo([*args[:-1], redis_url, "--prefix", "other"], out=io.StringIO()) == 0
