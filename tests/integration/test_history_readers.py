"""The record-history checker reads the sinks with their own clients: contents written
here with redis-py and ``deltalake`` (not by a committer) are read back whole, zero rows,
remnants and strangers included, and judged."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pa_fs
import pytest
import redis
from deltalake import write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from tests.history import judge, read_delta, read_redis
from tests.reference import expected_of_lines
from transactional.testing.history import delta_log

pytestmark = pytest.mark.integration

LINES = [
    json.dumps({"id": 1, "text": "#a @u"}).encode(),
    json.dumps({"id": 2, "text": "#a"}).encode(),
    b"{broken",
]


def test_redis_is_read_whole_behind_its_prefix(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    p = "{run}:"
    client.hset(p + "hashtags", mapping={"#a": 2})
    client.hset(p + "users", mapping={"@u": 1, "@gone": 0})
    client.hset(p + "users_hashtags", mapping={"@u:#a": 1})
    client.hset(p + "tweet_ids", mapping={"1": 1, "2": 2})
    client.rpush(p + "dead_letters", json.dumps({"raw": "{broken", "reason": "not JSON"}))
    client.set(p + "transactional:t:redis:txid", 4)  # bookkeeping: expected
    client.rpush(p + "transactional:t:redis:stage:0", "x")  # an unfinished commit's
    client.set(p + "stray", 1)
    client.set("{other}:hashtags", 1)  # another prefix: not this run's
    client.close()

    image = read_redis(redis_url, p)
    assert image.tables == {
        "hashtags": {("#a",): 2},
        "users": {("@u",): 1, ("@gone",): 0},
        "users_hashtags": {("@u", "#a"): 1},
        "tweet_ids": {("1",): 1, ("2",): 2},
    }
    assert image.dead_letters == ["{broken"]
    assert image.strange == [f"key '{p}stray'"]
    assert image.leftovers == [f"staging key '{p}transactional:t:redis:stage:0'"]

    verdict = judge(image, expected_of_lines(LINES))
    assert verdict.duplicated == ("tweet_ids '2': 2 times, not 1",)
    assert verdict.leftovers == (
        f"staging key '{p}transactional:t:redis:stage:0'",
        "users '@gone' counting 0",
    )
    assert verdict.phantoms == (f"key '{p}stray'",)
    assert not verdict.lost and not verdict.miscounted


def test_a_redis_run_without_ids_has_none(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.hset("hashtags", mapping={"#a": 2})
    client.close()
    assert read_redis(redis_url).tables == {"hashtags": {("#a",): 2}}


def test_delta_is_read_whole_with_deltalake(tmp_path: Path) -> None:
    def table(name: str, rows: list[dict[str, object]], app_id: str = "") -> None:
        # Marked as a committer marks its commits: a txn action of its app id.
        app_id = app_id or f"tweets:delta:{name}"
        marker = CommitProperties(app_transactions=[Transaction(app_id, 1)])
        write_deltalake(str(tmp_path / name), pa.Table.from_pylist(rows), commit_properties=marker)

    # Opaque tables: (keys..., count, prev, txid).
    table("hashtags", [{"hashtag": "#a", "count": 2, "prev": 0, "txid": 2}])
    table(
        "users",
        [
            {"user": "@u", "count": 1, "prev": 0, "txid": 1},
            {"user": "@gone", "count": 0, "prev": 0, "txid": 0},  # an undo not deleted
        ],
    )
    # Rows committed with the fence's token only: no txid marker says they are there.
    pair = [{"user": "@u", "hashtag": "#a", "count": 1, "prev": 0, "txid": 1}]
    table("users_hashtags", pair, app_id="tweets:delta:users_hashtags:fence")
    table(
        "tweet_ids",
        [
            {"id": 1, "count": 1, "prev": 0, "txid": 1},
            {"id": 2, "count": 1, "prev": 0, "txid": 3},  # an attempt past the commit
        ],
    )
    table("dead_letters", [{"raw": "{broken", "reason": "not JSON", "txid": 1}])
    table("extra", [{"x": 1}])

    image = read_delta(tmp_path, committed=2)
    assert image.tables == {
        "hashtags": {("#a",): 2},
        "users": {("@u",): 1, ("@gone",): 0},
        "users_hashtags": {("@u", "#a"): 1},
        "tweet_ids": {("1",): 1, ("2",): 1},
    }
    assert image.dead_letters == ["{broken"]
    unmarked = "users_hashtags version 0: rows changed in a commit with no txid marker"
    assert image.strange == ["table 'extra'", unmarked]
    assert image.leftovers == ["tweet_ids '2' marked txid 3, past the committed 2"]

    verdict = judge(image, expected_of_lines(LINES))
    assert verdict.leftovers == (
        "tweet_ids '2' marked txid 3, past the committed 2",
        "users '@gone' counting 0",
    )
    assert verdict.phantoms == ("table 'extra'", unmarked)
    assert not (verdict.lost or verdict.duplicated or verdict.miscounted)


def test_a_delta_commit_under_a_deposed_token_is_named_from_the_log(tmp_path: Path) -> None:
    """Each commit's writer token, as the committers write it (a claim's fence
    transaction; the ``{"fence": N}`` of each commit's ``userMetadata``): rows written
    under a token below one an earlier commit carried are a deposed leader's."""
    where = str(tmp_path / "hashtags")
    schema = pa.schema([("hashtag", pa.string()), ("count", pa.int64())])

    def commit(rows: list[dict[str, object]], app: str, version: int, fence: int) -> None:
        properties = CommitProperties(
            app_transactions=[Transaction(app, version)],
            custom_metadata={"userMetadata": json.dumps({"fence": fence})},
        )
        data = pa.Table.from_pylist(rows, schema=schema)
        write_deltalake(where, data, mode="append", commit_properties=properties)

    claim, marker = "tweets:delta:hashtags:fence", "tweets:delta:hashtags"
    commit([], claim, 1, 1)  # version 0: leader 1 claims the table
    commit([{"hashtag": "#a", "count": 1}], marker, 1, 1)  # 1: its txid 1
    commit([], claim, 2, 2)  # 2: leader 2 claims it
    commit([{"hashtag": "#b", "count": 1}], marker, 2, 2)  # 3: its txid 2
    commit([{"hashtag": "#c", "count": 1}], marker, 3, 1)  # 4: leader 1, deposed, writes

    fs, path = pa_fs.FileSystem.from_uri(where)
    log = delta_log(fs, f"{path}/_delta_log")
    assert [(c.version, c.fence, c.changes, c.marked) for c in log] == [
        (0, 1, False, False),
        (1, 1, True, True),
        (2, 2, False, False),
        (3, 2, True, True),
        (4, 1, True, True),
    ]
    image = read_delta(tmp_path)
    assert image.strange == [
        "hashtags version 4: rows changed under fence 1 after version 2 was written "
        "under fence 2 (a deposed leader's write)"
    ]
    assert image.tables["hashtags"] == {("#a",): 1, ("#b",): 1, ("#c",): 1}
