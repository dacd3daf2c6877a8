"""The demo's record history, judged by the package's checker
(``transactional.testing.history``): the demo's counter tables, read with the sinks' own
clients (redis-py, ``deltalake``), never through the framework's committers or readers,
against the demo's answer (``tests.reference``: its counting rule written again over the
input's bytes).

After Jepsen's checkers (a history judged against a model computed apart from the
system) and Flink's end-to-end exactly-once tests (every record of the source counted
in the sink). The demo must run with ``--record-ids``, which counts every tweet under
its own id as well (``tweet_ids``), so each tweet is judged one by one: lost,
duplicated or phantom; each bad line is one dead letter, judged by its text. A sink that
holds no per-record ids fails the check (``MissingIds``): it could not show a lost
record. A test whose run did not count them says so (``ids=False``): then each table is
still judged key by key, every row and dead letter, but a lost or duplicated tweet
shows only as a miscount of its hashtags and users.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from examples.tweets.bolts import HASHTAGS, TWEET_IDS, USERS, USERS_HASHTAGS
from examples.tweets.sinks import counter_tables
from tests.reference import Expected
from transactional.testing import history
from transactional.testing.history import Answer, Image, Verdict

__all__ = [
    "IDS",
    "Image",
    "MissingIds",
    "Verdict",
    "answer",
    "assert_exact",
    "judge",
    "read_delta",
    "read_redis",
    "tweet_counts",
]

#: The demo's counter tables, ``tweet_ids`` among them.
TABLES = list(counter_tables(record_ids=True).values())
IDS = TWEET_IDS


class MissingIds(AssertionError):
    """The sink holds no per-record ids: the run was not started with ``--record-ids``."""


def answer(expected: Expected, *, ids: bool = True) -> Answer:
    """The demo's answer as the checker takes it (``ids``: with the tweets by id)."""
    tables: dict[str, Mapping[Any, int]] = {
        HASHTAGS: expected.hashtags,
        USERS: expected.users,
        USERS_HASHTAGS: expected.pairs,
    }
    if ids:
        tables[IDS] = expected.ids
    return Answer(tables, IDS if ids else None, expected.dead_letters)


def judge(image: Image, expected: Expected, *, midway: bool = False, ids: bool = True) -> Verdict:
    """``image`` against the answer ``expected`` (``ids=False``: the run did not count
    tweets by id, so a ``tweet_ids`` table in the sink is a phantom)."""
    if ids and IDS not in image.tables:
        raise MissingIds(
            f"{image.sink}: no per-record ids in the sink; run the demo with --record-ids"
        )
    return history.judge(image, answer(expected, ids=ids), TABLES, midway=midway)


def assert_exact(image: Image, expected: Expected, *, ids: bool) -> None:
    """``image`` holds exactly the answer ``expected`` (``judge``), or an
    ``AssertionError`` listing what is lost, duplicated, phantom, left over or
    miscounted."""
    verdict = judge(image, expected, ids=ids)
    assert verdict.exact, str(verdict)


def tweet_counts(image: Image) -> Counter[int]:
    """How many times the sink counts each tweet, by id (empty: no ``tweet_ids``)."""
    return Counter({int(str(key[0])): int(n) for key, n in image.tables.get(IDS, {}).items()})


def read_redis(
    url: str, prefix: str = "", *, cluster: bool = False, inputs: str | None = None
) -> Image:
    """The demo's tables in Redis behind ``prefix`` (``history.read_redis``)."""
    return history.read_redis(url, TABLES, key_prefix=prefix, cluster=cluster, inputs=inputs)


def read_delta(path: Path | str, committed: int | None = None) -> Image:
    """The demo's tables under ``path``, a directory or an S3 URL (``history.read_delta``)."""
    return history.read_delta(path, TABLES, committed=committed)
