"""A poison batch, as a user meets one: a txid the sink refuses on every attempt stops
the demo with an error naming the txid, its metadata and the cause, keeps the state
where it was, and a rerun after the cause is removed finishes with exact counts."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr
from pathlib import Path

import pytest
import redis

from coordinators import SQLiteStateStore
from examples.tweets.cli import main as demo
from tests.history import assert_exact, read_redis
from tests.reference import expected_counts, lines_of

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SINK_TXID = "transactional:tweets:sink:txid"


def tweets(start: int, count: int, users: bool) -> bytes:
    """``count`` tweets; without ``users``, none mentions a user, so the sink's ``users``
    hash is never created by them."""
    lines = []
    for i in range(start, start + count):
        mention = f" @u{i % 3}" if users else ""
        lines.append(json.dumps({"id": i, "text": f"#t{i % 4} #all{mention}"}))
        if i % 9 == 0:
            lines.append(f'{{"id": {i}, "broken')  # a dead letter now and then
    return "".join(line + "\n" for line in lines).encode()


def test_a_poison_txid_stops_the_run_and_a_rerun_after_the_fix_finishes_exactly(
    redis_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "tweets.jsonl"
    source.write_bytes(tweets(0, 40, users=False))
    first_size = source.stat().st_size
    state = tmp_path / "state"
    args = [
        "run",
        "--input",
        str(source),
        "--spout",
        "partitioned",
        "--sink",
        "redis",
        "--redis-url",
        redis_url,
        "--state-dir",
        str(state),
        "--batch-size",
        "15",
        "--until-drained",
        "--master",
        "local[2]",
        "--top",
        "0",
    ]
    assert demo(args, out=io.StringIO()) == 0
    first = expected_counts(source)
    assert_exact(read_redis(redis_url), first, ids=False)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    committed = int(client.get(SINK_TXID))  # type: ignore[arg-type]
    assert committed == -(-len(lines_of(source)) // 15)  # 15 lines a txid
    poison = committed + 1

    # More tweets arrive, and another program takes the key of the `users` hash.
    with source.open("ab") as f:
        f.write(tweets(40, 30, users=True))
    client.set("users", "not a hash")
    err = io.StringIO()
    with redirect_stderr(err):
        code = demo([*args, "--max-attempts", "3"], out=io.StringIO())
    assert code == 1
    errors = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err.getvalue()
    message = errors[0]
    assert message.startswith(f"error: PoisonBatchError: txid {poison} failed on all 3 attempts")
    # Its metadata: the range of the one partition file that starts after the first run.
    assert (
        "metadata={'meta': {'partitions': 1}, 'partitions': {0: FileRange(file='tweets.jsonl', "
        f"offset={first_size}, length=" in message
    )
    assert f"CommitError: Redis refused txid {poison}: users is a string, not a hash" in message
    assert "remove the cause and start the runner again" in message

    # Nothing moved: the store waits at the poison txid, the sink holds the one before.
    store = SQLiteStateStore(state / "state.db")
    store.open("tweets")
    stored = store.read_state()
    store.close()
    assert stored.currtx == poison and poison in stored.metas
    assert int(client.get(SINK_TXID)) == poison - 1  # type: ignore[arg-type]
    assert client.get("users") == "not a hash"
    client.delete("users")  # "users" held no counts before: nothing is lost with it
    assert_exact(read_redis(redis_url), first, ids=False)

    # The cause removed, the same command resumes at the poison txid and finishes.
    out = io.StringIO()
    assert demo(args, out=out) == 0, out.getvalue()
    assert_exact(read_redis(redis_url), expected_counts(source), ids=False)
    assert int(client.get(SINK_TXID)) == -(-len(lines_of(source)) // 15)  # type: ignore[arg-type]
    client.close()
