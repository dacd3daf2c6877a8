"""What a run left in its sinks and its log, read back for comparison with the answers of
``tests.reference``."""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import redis
import redis.cluster

from committers import decode_key
from tests.reference import Expected


def redis_contents(url: str, prefix: str = "", cluster: bool = False) -> Expected:
    """The demo's counts in Redis (every key behind ``prefix``), read with redis-py
    (``cluster``: its Redis Cluster client, which finds each key's node itself)."""
    client: Any = (
        redis.cluster.RedisCluster.from_url(url, decode_responses=True)
        if cluster
        else redis.Redis.from_url(url, decode_responses=True)
    )
    try:
        got = Expected()
        got.hashtags = Counter({k: int(v) for k, v in client.hgetall(f"{prefix}hashtags").items()})
        got.users = Counter({k: int(v) for k, v in client.hgetall(f"{prefix}users").items()})
        # Fields are (user, hashtag) keys as committers.encode_key writes them (a ':' in
        # a user is escaped, so pairs never merge): decoded, compared with the pairs.
        pairs = client.hgetall(f"{prefix}users_hashtags")
        got.pairs = Counter({decode_key(k, 2): int(v) for k, v in pairs.items()})
        dead = client.lrange(f"{prefix}dead_letters", 0, -1)
        got.dead_letters = [json.loads(v)["raw"] for v in dead]
        ids = client.hgetall(f"{prefix}tweet_ids")  # with --record-ids
        got.ids = Counter({int(k): int(v) for k, v in ids.items()})
        return got
    finally:
        client.close()


def delta_contents(spark: Any, path: Path) -> Expected:
    """The demo's tables under ``path``, read with Spark: every row, a row counting 0
    too (an undo should have deleted it; ``assert_exact`` sees it)."""

    def table(name: str) -> list[Any]:
        return spark.read.format("delta").load(str(path / name)).collect()

    got = Expected()
    got.hashtags = Counter({r["hashtag"]: r["count"] for r in table("hashtags")})
    got.users = Counter({r["user"]: r["count"] for r in table("users")})
    got.pairs = Counter({(r["user"], r["hashtag"]): r["count"] for r in table("users_hashtags")})
    got.dead_letters = [r["raw"] for r in table("dead_letters")]
    if (path / "tweet_ids").is_dir():  # with --record-ids
        got.ids = Counter({r["id"]: r["count"] for r in table("tweet_ids")})
    return got


def assert_exact(got: Expected, expected: Expected) -> None:
    """``got`` holds exactly the answer: as plain dicts, so a key counting 0 (which a
    Counter's equality would take for an absent one) is a difference too. Per-record
    ids are compared when the run counted them (``--record-ids``); a test that needs
    them checked whatever the sink held uses ``tests.history.judge``."""
    assert dict(got.hashtags) == dict(expected.hashtags)
    assert dict(got.users) == dict(expected.users)
    if any(isinstance(k, str) for k in got.pairs):
        assert dict(got.pairs) == {f"{u}:{t}": n for (u, t), n in expected.pairs.items()}
    else:
        assert dict(got.pairs) == dict(expected.pairs)
    assert sorted(got.dead_letters) == sorted(expected.dead_letters)
    if got.ids:  # the run counted tweets by id (--record-ids)
        assert dict(got.ids) == dict(expected.ids)


class FailedTxids(logging.Handler):
    """Collects the runner's "txid failed" lines; ``seen`` is set at the first."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("txid failed"):
            self.messages.append(message)
            self.seen.set()


class Said(logging.Handler):
    """Watches ``logger`` (at INFO, for the ``with`` block) for a line holding ``text``:
    ``seen`` is set at the first."""

    def __init__(self, logger: str, text: str) -> None:
        super().__init__(logging.INFO)
        self.logger = logging.getLogger(logger)
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()

    def __enter__(self) -> Said:
        self._level = self.logger.level
        self.logger.addHandler(self)
        self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self._level)
