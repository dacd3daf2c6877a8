"""RedisCommitter against a real redis-server: replays are skipped (transactional) or
undone and redone (opaque), checked against sums computed here independently."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis

from committers import CounterTable, RedisCommitter
from transactional.committer import CommitterContext
from transactional.errors import CommitError, ConfigurationError
from transactional.testing.servers import free_port
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

pytestmark = [pytest.mark.integration, pytest.mark.connect]

COUNTERS = {
    "tags": CounterTable("hashtags", ("tag",)),
    "user_tags": CounterTable("users_hashtags", ("user", "tag")),
}

Batch = dict[str, list[Any]]


def batch(
    tags: list[str], user_tags: list[tuple[str, str]], dead: Sequence[tuple[str, str]] = ()
) -> Batch:
    return {"tags": list(tags), "user_tags": list(user_tags), "bad": list(dead)}


def inputs(spark: Any, b: Batch) -> dict[str, Any]:
    """One row per occurrence with count 1, so the committer must sum duplicates."""
    return {
        "tags": spark.createDataFrame([(t, 1) for t in b["tags"]], "tag string, count long"),
        "user_tags": spark.createDataFrame(
            [(u, t, 1) for u, t in b["user_tags"]], "user string, tag string, count long"
        ),
        "bad": spark.createDataFrame(b["bad"], "raw string, reason string"),
    }


def expected(*batches: Batch) -> tuple[dict[str, int], dict[str, int]]:
    tags: Counter[str] = Counter()
    user_tags: Counter[str] = Counter()
    for b in batches:
        tags.update(b["tags"])
        user_tags.update(f"{u}:{t}" for u, t in b["user_tags"])
    return dict(tags), dict(user_tags)


def expected_dead(*txid_batches: tuple[int, Batch]) -> list[dict[str, Any]]:
    return [
        {"raw": raw, "reason": reason, "txid": txid}
        for txid, b in txid_batches
        for raw, reason in b["bad"]
    ]


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


def sink(client: redis.Redis) -> tuple[dict[str, int], dict[str, int], list[dict[str, Any]]]:
    """Plain current counts in both modes: readers need not know the mode."""
    tags = {k: int(v) for k, v in client.hgetall("hashtags").items()}
    user_tags = {k: int(v) for k, v in client.hgetall("users_hashtags").items()}
    dead = [json.loads(x) for x in client.lrange("dead_letters", 0, -1)]
    return tags, user_tags, dead


def opened(redis_url: str, spark: Any, mode: CommitMode, topology: str = "t1") -> RedisCommitter:
    committer = RedisCommitter(redis_url, COUNTERS, dead_letters="bad", mode=mode)
    committer.open(CommitterContext(spark, topology, "counts"))
    return committer


def commit(
    committer: RedisCommitter, spark: Any, txid: int, attempt: int, b: Batch
) -> CommitOutcome:
    at = TransactionAttempt(txid, attempt)
    return committer.commit(at, committer.prepare(at, inputs(spark, b)))


B1 = batch(["#a", "#a", "#b"], [("@x", "#a"), ("@x", "#a"), ("@y", "#b")], [("{bad", "json")])
B2 = batch(["#b", "#c"], [("@y", "#b"), ("@z", "#c")])
B3 = batch(["#a"], [("@x", "#a")], [("", "empty"), ("x", "no text")])


def test_transactional_replays_are_skipped(redis_url: str, spark: Any, client: redis.Redis) -> None:
    committer = opened(redis_url, spark, CommitMode.TRANSACTIONAL)
    assert committer.committed_txid() is None
    for txid, b in ((1, B1), (2, B2), (3, B3)):
        assert commit(committer, spark, txid, 1, b) is CommitOutcome.APPLIED
    after_three = sink(client)
    assert after_three == (*expected(B1, B2, B3), expected_dead((1, B1), (2, B2), (3, B3)))

    # A replay of an older txid, and of the last with a new attempt and other contents.
    assert commit(committer, spark, 2, 2, B2) is CommitOutcome.SKIPPED
    assert commit(committer, spark, 3, 7, B1) is CommitOutcome.SKIPPED
    assert sink(client) == after_three
    assert committer.committed_txid() == 3
    assert client.get("transactional:t1:counts:txid") == "3"
    committer.close()


def test_opaque_replay_undoes_the_earlier_attempt(
    redis_url: str, spark: Any, client: redis.Redis
) -> None:
    committer = opened(redis_url, spark, CommitMode.OPAQUE)
    assert commit(committer, spark, 1, 1, B1) is CommitOutcome.APPLIED
    first = batch(
        ["#a", "#b", "#new"],
        [("@x", "#a"), ("@y", "#b"), ("@n", "#new")],
        [("r1", "bad"), ("r2", "bad")],
    )
    assert commit(committer, spark, 2, 1, first) is CommitOutcome.APPLIED
    assert sink(client) == (*expected(B1, first), expected_dead((1, B1), (2, first)))

    # The replay drops "#new" (created by the first attempt: must vanish) and "#b" (existed
    # before txid 2: back to its txid-1 value), and has other dead letters.
    second = batch(["#a", "#a", "#c"], [("@x", "#a"), ("@z", "#c")], [("r3", "worse")])
    assert commit(committer, spark, 2, 2, second) is CommitOutcome.REAPPLIED
    tags, user_tags, dead = sink(client)
    assert (tags, user_tags) == expected(B1, second)
    assert "#new" not in tags and "@n:#new" not in user_tags
    assert tags["#b"] == 1 and user_tags["@y:#b"] == 1
    assert dead == expected_dead((1, B1), (2, second))

    # The same replay again changes nothing; an empty replay leaves only txid 1.
    assert commit(committer, spark, 2, 3, second) is CommitOutcome.REAPPLIED
    assert sink(client) == (*expected(B1, second), expected_dead((1, B1), (2, second)))
    assert commit(committer, spark, 2, 4, batch([], [])) is CommitOutcome.REAPPLIED
    assert sink(client) == (*expected(B1), expected_dead((1, B1)))
    assert commit(committer, spark, 2, 5, second) is CommitOutcome.REAPPLIED

    assert commit(committer, spark, 3, 1, B3) is CommitOutcome.APPLIED
    assert committer.committed_txid() == 3
    with pytest.raises(CommitError, match=r"txid 2 .*holds txid 3"):
        commit(committer, spark, 2, 6, second)
    assert sink(client) == (*expected(B1, second, B3), expected_dead((1, B1), (2, second), (3, B3)))
    committer.close()


@pytest.mark.parametrize("mode", list(CommitMode))
def test_a_large_commit_is_staged_in_chunks_and_exact(
    redis_url: str,
    spark: Any,
    client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    mode: CommitMode,
) -> None:
    import committers.redis._send

    # Staged above 3 fields, in chunks of 3: every hash of these batches is staged.
    monkeypatch.setattr(committers.redis._send, "STAGE_CHUNK", 3)
    staged: list[str] = []
    stage = RedisCommitter._stage

    def spy(self: RedisCommitter, server: redis.Redis, fields: list[str]) -> str:
        staged.append(stage(self, server, fields))
        return staged[-1]

    monkeypatch.setattr(RedisCommitter, "_stage", spy)
    committer = opened(redis_url, spark, mode)
    big = batch(
        [f"#t{i % 9}" for i in range(40)], [(f"@u{i % 4}", f"#t{i % 5}") for i in range(30)]
    )
    other = batch([f"#t{i % 7}" for i in range(20)], [(f"@v{i}", "#z") for i in range(8)])
    assert commit(committer, spark, 1, 1, big) is CommitOutcome.APPLIED
    assert sink(client)[:2] == expected(big)
    assert len(staged) == 2 and not any(client.exists(k) for k in staged)  # deleted after
    replay = CommitOutcome.SKIPPED if mode is CommitMode.TRANSACTIONAL else CommitOutcome.REAPPLIED
    assert commit(committer, spark, 1, 2, other if replay is CommitOutcome.REAPPLIED else big) is (
        replay
    )
    assert commit(committer, spark, 2, 1, big) is CommitOutcome.APPLIED
    first = other if mode is CommitMode.OPAQUE else big
    assert sink(client)[:2] == expected(first, big)
    assert not client.keys("transactional:t1:counts:stage:*")
    # The connection drops after the increments were staged, before the script ran:
    # nothing is applied, the staging is cleared, and the retry is exact.
    script = committer._script

    def drop(*args: Any, **kwargs: Any) -> Any:
        committer._script = script
        raise redis.ConnectionError("Connection reset by peer")

    committer._script = drop
    with pytest.raises(CommitError, match="Retrying the commit is safe"):
        commit(committer, spark, 3, 1, other)
    assert sink(client)[:2] == expected(first, big)
    assert not client.keys("transactional:t1:counts:stage:*")
    assert commit(committer, spark, 3, 2, other) is CommitOutcome.APPLIED
    assert sink(client)[:2] == expected(first, big, other)
    committer.close()


def test_a_group_keeps_each_dead_letter_with_its_own_txid(
    redis_url: str, spark: Any, client: redis.Redis
) -> None:
    committer = opened(redis_url, spark, CommitMode.OPAQUE)
    attempts = [TransactionAttempt(t, 10 + t) for t in (1, 2, 3)]
    batches = (B1, B2, B3)
    prepared = [
        committer.prepare(a, inputs(spark, b)) for a, b in zip(attempts, batches, strict=True)
    ]
    assert committer.commit_group(attempts, prepared) is CommitOutcome.APPLIED
    assert sink(client) == (
        *expected(*batches),
        expected_dead(*zip((1, 2, 3), batches, strict=True)),
    )
    assert committer.committed_txid() == 3
    # The group again, txid 2 empty and txid 3 without dead letters: undone, then applied.
    again = [prepared[0], None, committer.prepare(attempts[2], inputs(spark, batch(["#q"], [])))]
    assert committer.commit_group(attempts, again) is CommitOutcome.REAPPLIED
    assert sink(client) == (*expected(B1, batch(["#q"], [])), expected_dead((1, B1)))
    committer.close()


def test_opaque_refuses_to_undo_a_shared_dead_letter_list(
    redis_url: str, spark: Any, client: redis.Redis
) -> None:
    committer = opened(redis_url, spark, CommitMode.OPAQUE)
    commit(committer, spark, 1, 1, B1)
    client.rpush("dead_letters", json.dumps({"raw": "other", "reason": "x", "txid": 9}))
    before = sink(client)
    with pytest.raises(CommitError, match="dead_letters_key"):
        commit(committer, spark, 1, 2, B2)
    assert sink(client) == before  # refused before the first write
    committer.close()


def test_a_foreign_key_type_is_refused_before_any_write(
    redis_url: str, spark: Any, client: redis.Redis
) -> None:
    committer = opened(redis_url, spark, CommitMode.TRANSACTIONAL)
    client.set("users_hashtags", "not a hash")
    with pytest.raises(CommitError, match="users_hashtags is a string, not a hash"):
        commit(committer, spark, 1, 1, B1)
    assert client.exists("hashtags") == 0 and committer.committed_txid() is None
    committer.close()


def test_open_fails_clearly(redis_url: str, spark: Any) -> None:
    context = CommitterContext(spark, "t1", "counts")
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(ConfigurationError, match=f"{dead_url}.*redis-server is running"):
        RedisCommitter(dead_url, COUNTERS, socket_timeout=2).open(context)

    committer = opened(redis_url, spark, CommitMode.TRANSACTIONAL)
    commit(committer, spark, 1, 1, B1)
    committer.close()
    with pytest.raises(ConfigurationError, match="transactional mode"):
        opened(redis_url, spark, CommitMode.OPAQUE)


def test_inputs_must_match_the_configuration(redis_url: str, spark: Any) -> None:
    committer = opened(redis_url, spark, CommitMode.TRANSACTIONAL)
    given = inputs(spark, B1)
    del given["bad"]
    with pytest.raises(ConfigurationError, match="expects inputs"):
        committer.prepare(TransactionAttempt(1, 1), given)
    committer.close()


@pytest.mark.parametrize("mode", list(CommitMode))
def test_a_key_prefix_goes_before_every_key_written_and_read(
    redis_url: str, spark: Any, client: redis.Redis, mode: CommitMode
) -> None:
    committer = RedisCommitter(
        redis_url, COUNTERS, dead_letters="bad", mode=mode, key_prefix="{app}:"
    )
    committer.open(CommitterContext(spark, "t1", "counts"))
    for txid, b in ((1, B1), (2, B2), (3, B3)):
        assert commit(committer, spark, txid, 1, b) is CommitOutcome.APPLIED
    committer.close()
    tags, user_tags = expected(B1, B2, B3)
    # Every key the commits left is behind the prefix, the namespace's included.
    keys = set(client.keys("*"))
    assert keys and all(key.startswith("{app}:") for key in keys), keys
    assert client.get("{app}:transactional:t1:counts:txid") == "3"
    assert {k: int(v) for k, v in client.hgetall("{app}:hashtags").items()} == tags
    assert {k: int(v) for k, v in client.hgetall("{app}:users_hashtags").items()} == user_tags
    dead = [json.loads(x) for x in client.lrange("{app}:dead_letters", 0, -1)]
    assert dead == expected_dead((1, B1), (2, B2), (3, B3))
    # The committer's reads find them, opened or not.
    reader = RedisCommitter(redis_url, COUNTERS, dead_letters="bad", key_prefix="{app}:")
    assert {k[0]: v for k, v in reader.read("hashtags").items()} == tags
    assert reader.lookup(COUNTERS["tags"], [("#a",), ("#none",)]) == [tags["#a"], None]
    assert reader.dead_letter_count() == len(dead)
    assert reader.sink_marker("t1", "counts") == 3
    reader.namespace = "{app}:transactional:t1:counts"
    snapshot = reader.read_all()
    assert snapshot.txid == 3 and snapshot.dead_letters == dead
    assert {k[0]: v for k, v in snapshot.tables["hashtags"].items()} == tags
